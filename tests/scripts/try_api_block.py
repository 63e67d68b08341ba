"""A script that profiles its own loop with a `trainprof.profile()` block, gradients zeroed in
place: `python try_api_block.py OUT [STEPS]`. `trainprof try OUT` re-runs this script."""

import sys

import torch
from torch import nn

import trainprof

out, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
with trainprof.profile(out, wait=1, warmup=1, active=2, max_steps=12, show=False) as run:
    for _ in range(steps):
        loss = model(torch.randn(32, 32)).pow(2).mean()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
print("profiled" if run.folder is not None else "not profiled", f"loss {loss.item():.3f}")
