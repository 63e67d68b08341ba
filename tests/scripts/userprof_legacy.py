"""A loop under the legacy torch.autograd.profiler.profile; prints how many events it got.

Usage: userprof_legacy.py [STEPS].
"""

import sys

import torch
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 12
model = nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with torch.autograd.profiler.profile() as prof:  # PROFILE_LINE
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
print(f"EVENTS {len(prof.function_events)}")
