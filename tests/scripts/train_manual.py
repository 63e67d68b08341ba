"""Hand-written SGD: no torch optimizer, no DataLoader. Steps come from backward()."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
lr = 0.01
for _ in range(8):
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    loss = nn.functional.mse_loss(model(x), y)
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
print("manual done")
