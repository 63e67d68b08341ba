"""A loop that runs its own torch.profiler with a schedule and tensorboard_trace_handler.

Usage: userprof_tb.py LOGDIR [STEPS]. Under plain python it writes one trace into LOGDIR.
"""

import sys

import torch
from torch import nn

logdir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
model = nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with torch.profiler.profile(  # PROFILE_LINE
    schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
    on_trace_ready=torch.profiler.tensorboard_trace_handler(logdir),
) as prof:
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        prof.step()
print("done")
