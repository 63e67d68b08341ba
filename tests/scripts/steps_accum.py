"""Gradient accumulation: 3 backward() per optimizer step; a step is an optimizer step."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(TensorDataset(torch.randn(72, 4), torch.randn(72, 1)), batch_size=4)
for i, (x, y) in enumerate(loader):  # 18 batches -> 6 optimizer steps
    nn.functional.mse_loss(model(x), y).backward()
    if (i + 1) % 3 == 0:
        opt.step()
        opt.zero_grad()
