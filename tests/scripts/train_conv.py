"""A tiny fp32 CNN loop (no autocast): `trainprof run` then times bf16 convs and matmuls."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(512, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(6):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(torch.randn(4, 3, 8, 8)), torch.tensor([0, 1] * 2))
    loss.backward()
    opt.step()
