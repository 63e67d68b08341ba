"""A tiny accelerate loop (CPU) with a slow dataset and num_workers=0."""

import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __init__(self, n: int) -> None:
        self.x, self.y = torch.randn(n, 16), torch.randn(n, 1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(0.002)  # a slow per-sample transform
        return self.x[i], self.y[i]


torch.manual_seed(0)
accelerator = Accelerator(cpu=True)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Slow(160), batch_size=8)  # LOADER_LINE
model, opt, loader = accelerator.prepare(model, opt, loader)
for x, y in loader:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    opt.step()
