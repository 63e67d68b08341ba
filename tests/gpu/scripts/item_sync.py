"""An MLP whose loop reads the loss on the host (`loss.item()`, a divergence check) every
`--every` steps: every step it is a host sync in each step; every 50 steps it is not in the
profiled steps (5-9 with the default window) and costs 1/50 as much.

    DEVICE=cpu python item_sync.py --steps 12 --width 64     # smoke test on a CPU
"""

import argparse
import math
import os

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--every", type=int, default=1)
parser.add_argument("--steps", type=int, default=120)
parser.add_argument("--batch", type=int, default=512)
parser.add_argument("--width", type=int, default=1024)
args = parser.parse_args()
device = torch.device(os.environ.get("DEVICE", "cuda"))
torch.manual_seed(0)

w = args.width
model = nn.Sequential(
    nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
    nn.Linear(w, 10),
).to(device)  # fmt: skip
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(args.batch, w, device=device)
y = torch.randint(0, 10, (args.batch,), device=device)
for step in range(args.steps):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if (step + 1) % args.every == 0:
        value = loss.item()  # ITEM_LINE
        if not math.isfinite(value):
            raise SystemExit(f"diverged at step {step}")
print(f"final loss {loss.item():.4f} on {device}, read every {args.every} steps")
