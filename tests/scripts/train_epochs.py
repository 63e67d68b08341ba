"""Three epochs over one DataLoader, then three epochs each over a DataLoader built anew for
the epoch (the same constructor call): trainprof.json must list two DataLoaders, not six.
The samples are made in __getitem__ (CPU work in the loop, num_workers=0), so fetching is a
real share of the step."""

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)


class Synthetic(Dataset):
    def __len__(self) -> int:
        return 128

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        # Heavy enough that workers pay for handing batches between processes, even on a
        # busy machine where that costs 1-4 ms per batch (dataloader-starvation models it).
        x = torch.randn(256, 512, generator=g).sin().mean(1)
        return x, x[:1].clone()


data = Synthetic()
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def train(loader: DataLoader) -> None:
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


loader = DataLoader(data, batch_size=32)  # ONE_LOADER
for _epoch in range(3):
    train(loader)
for _epoch in range(3):
    train(DataLoader(data, batch_size=32, shuffle=True))  # LOADER_PER_EPOCH
print("done")
