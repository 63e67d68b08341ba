"""A module-level training loop (no function) with the reads issue #10 item 8 is about.

The DataLoader shuffles (its base seed and RandomSampler's seed are `.item()` on CPU tensors),
the dataset's `__getitem__` reads its target with `.item()`, the loss is printed every step,
and a TorchMetrics update follows `opt.step()`. Small epochs, so a new DataLoader iterator is
created inside the profiling window.
"""

import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Points(Dataset):
    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, 8)
        self.y = torch.randint(0, 2, (n,))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        target = self.y[i]
        return self.x[i], float(target.item())  # DATASET_READ


torch.manual_seed(0)
loader = DataLoader(Points(32), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mean_loss = torchmetrics.MeanMetric()
for _epoch in range(4):
    for x, y in loader:
        opt.zero_grad()
        out = model(x).squeeze(1)  # FORWARD_LINE
        loss = nn.functional.mse_loss(out, y.float())
        loss.backward()
        opt.step()  # STEP_LINE
        mean_loss.update(loss.detach())  # METRIC_LINE
        print(f"loss {loss.item():.4f}")  # PRINT_LINE
print("done", float(mean_loss.compute()))
