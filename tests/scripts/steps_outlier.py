"""A plain loop of 24 steps where step 18 sleeps 1.5 s (the machine "got busy"), and an
evaluation pass (model.eval() + no_grad over a validation loader) after step 11, so step 12
holds it. Usage: steps_outlier.py"""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
train = DataLoader(TensorDataset(torch.randn(24 * 16, 32), torch.randn(24 * 16, 1)), batch_size=16)
val = DataLoader(TensorDataset(torch.randn(16 * 16, 32), torch.randn(16 * 16, 1)), batch_size=16)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i, (x, y) in enumerate(train):
    if i == 18:
        time.sleep(1.5)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    if i == 11:
        model.eval()
        with torch.no_grad():
            val_loss = sum(nn.functional.mse_loss(model(vx), vy) for vx, vy in val)
        model.train()
print("done")
