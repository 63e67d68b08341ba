"""A tiny real training loop: DataLoader, nn.Module, optimizer, a host read per step.

Usage: train_basic.py [STEPS]. Also writes to stderr from Python and from fd 2, which must
reach the terminal through trainprof's noise filter.
"""

import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 8
data = TensorDataset(torch.randn(steps * 16, 32), torch.randn(steps * 16, 1))
loader = DataLoader(data, batch_size=16, num_workers=0)  # LOADER_LINE
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)  # OPT_LINE
print("user stderr line", file=sys.stderr)
os.write(2, b"user fd2 line\n")
# What kineto prints from C++ on some builds: must be filtered like the real thing.
os.write(2, b"STAGE:2024-01-01 00:00:00 1:1 ActivityProfilerController.cpp:312] Completed Stage\n")
for x, y in loader:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    last = loss.item()  # ITEM_LINE
    if torch.isnan(loss):  # BOOL_LINE
        break
print(f"done loss={last:.4f}")
