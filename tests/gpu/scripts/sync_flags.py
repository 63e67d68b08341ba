"""A small loop with one synchronizing call per step on a known line (`loss.item()`), for
`--cuda-sync-events` (sync events in the trace) and `--sync-debug` (warnings with file:line).

    DEVICE=cpu python sync_flags.py --steps 12      # smoke test on a CPU (both flags are notes)
"""

import argparse
import os

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()
device = torch.device(os.environ.get("DEVICE", "cuda"))
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, 256, device=device)
y = torch.randn(64, 1, device=device)
losses = []
for _ in range(args.steps):
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.append(loss.item())  # SYNC_LINE
print(f"final loss {losses[-1]:.4f} on {device}")
