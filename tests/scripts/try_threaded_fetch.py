"""A dataset whose per-sample transform is one large tensor op (intra-op threads speed it up),
num_workers=0: a DataLoader worker, one thread, fetches slower than the loop did (a workload for
`trainprof try` and benchmarks/fix_efficacy.py). `python try_threaded_fetch.py [STEPS]`."""
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60


class Filtered(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n
        g = torch.Generator().manual_seed(0)
        self.kernel = torch.randn(384, 384, generator=g)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        x = torch.randn(384, 384)
        return (x @ self.kernel).tanh_()[:32].flatten()[:256], i % 10


torch.manual_seed(0)
loader = DataLoader(Filtered(8 * steps), batch_size=8, shuffle=True)
model = nn.Sequential(
    nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step, (x, y) in enumerate(loader):  # noqa: B007
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"trained {step + 1} steps, loss {loss.item():.3f}")
