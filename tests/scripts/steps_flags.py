"""Sets backend flags and uses autocast, GradScaler and torch.compile (eager backend: no C++
compiler needed), which the run metadata must report."""

import torch
from torch import nn

torch.backends.cudnn.benchmark = True
torch.set_float32_matmul_precision("medium")
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
compiled = torch.compile(model, backend="eager")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu")
for _ in range(5):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = compiled(torch.randn(4, 8)).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
