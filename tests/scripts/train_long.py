"""A long training run: STEPS steps (default 100000) of a tiny model, from a DataLoader with
WORKERS worker processes (default 0). Usage: train_long.py [STEPS] [WORKERS]."""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
workers = int(sys.argv[2]) if len(sys.argv) > 2 else 0


class Random(Dataset):
    def __len__(self) -> int:
        return steps * 4

    def __getitem__(self, i: int):
        return torch.randn(8), torch.randn(1)


model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Random(), batch_size=4, num_workers=workers)
for x, y in loader:
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
print("finished all steps")
