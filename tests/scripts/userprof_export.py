"""A loop under its own torch.profiler.profile(), exported with export_chrome_trace(PATH).

Usage: userprof_export.py PATH [STEPS].
"""

import sys

import torch
from torch import nn

path = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
model = nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(3):  # a few steps before the script's profiler starts
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
with torch.profiler.profile() as prof:  # PROFILE_LINE
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
prof.export_chrome_trace(path)
print("done")
