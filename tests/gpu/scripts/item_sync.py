"""An MLP whose loop reads the loss on the host (`loss.item()`, a divergence check) every
`--every` steps, and does some host work per step (`--host-n`: a NumPy sort standing in for
preparing the next batch, logging, bookkeeping).

Read every step, the sync stops the CPU from running ahead: the host work of the next step runs
while the GPU has nothing queued, so the step is GPU time + host time. Read every 50 steps, the
host work overlaps the GPU's queued work and the step is about max(GPU, host). The saving is
therefore real and measurable only when the GPU is busy for longer than the host work, so
`--calibrate` (plain python, no profiler) picks the host work as about half the GPU step on this
machine and prints it as JSON; the test passes it to both forms. On a launch-bound loop (GPU
faster than the CPU) the same sync would cost only the host's short wait in it.

    DEVICE=cpu python item_sync.py --steps 12 --width 64 --batch 64 --host-n 1000  # CPU smoke test
    DEVICE=cpu python item_sync.py --calibrate --width 64 --batch 64
"""

import argparse
import json
import math
import os
import time

import numpy as np
import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--every", type=int, default=1)
parser.add_argument("--steps", type=int, default=120)
parser.add_argument("--batch", type=int, default=4096)
parser.add_argument("--width", type=int, default=2048)
parser.add_argument("--host-n", type=int, default=200_000, help="elements sorted per step")
parser.add_argument("--calibrate", action="store_true")
args = parser.parse_args()
device = torch.device(os.environ.get("DEVICE", "cuda"))
torch.manual_seed(0)
rng = np.random.default_rng(0)

w = args.width
model = nn.Sequential(
    nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
    nn.Linear(w, 10),
).to(device)  # fmt: skip
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(args.batch, w, device=device)
y = torch.randint(0, 10, (args.batch,), device=device)


def host_work(n: int) -> float:
    return float(np.sort(rng.random(n))[n // 2])


def train_step() -> torch.Tensor:
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def sync() -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def calibrate() -> dict:
    """The GPU step (synced, median of 10) and the host work sized to about half of it."""
    for _ in range(3):
        train_step()
    sync()
    times = []
    for _ in range(10):
        t = time.perf_counter()
        train_step()
        sync()
        times.append(time.perf_counter() - t)
    step_s = sorted(times)[len(times) // 2]
    probe = 200_000
    per_elem = min(_timed(lambda: host_work(probe)) for _ in range(5)) / probe
    host_n = max(1000, int(0.5 * step_s / per_elem))
    return {"step_ms": round(step_s * 1e3, 3), "host_n": host_n,
            "host_ms": round(host_n * per_elem * 1e3, 3)}  # fmt: skip


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if args.calibrate:
    print(json.dumps(calibrate()))
    raise SystemExit(0)

for step in range(args.steps):
    loss = train_step()
    if (step + 1) % args.every == 0:
        value = loss.item()  # ITEM_LINE
        if not math.isfinite(value):
            raise SystemExit(f"diverged at step {step}")
    host_work(args.host_n)  # HOST_LINE
print(f"final loss {loss.item():.4f} on {device}, read every {args.every} steps")
