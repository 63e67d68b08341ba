"""fp16 autocast with a GradScaler; at iterations 3 and 8 an inf is written into a gradient after
backward(), so `scaler.step()` skips `optimizer.step()` there (and halves the scale). Every
iteration is still a training step. Writes the iterations the scaler skipped to argv[1].

    DEVICE=cpu python gradscaler_inf.py skipped.json --width 64     # smoke test on a CPU
"""

import argparse
import json
import os

import torch
from torch import nn

INF_AT = (3, 8)
parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--steps", type=int, default=14)
parser.add_argument("--width", type=int, default=1024)
args = parser.parse_args()
device = torch.device(os.environ.get("DEVICE", "cuda"))
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 1))
model = model.to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10)
x = torch.randn(256, args.width, device=device)
y = torch.randn(256, 1, device=device)
skipped = []
for i in range(args.steps):
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.float16):
        loss = nn.functional.mse_loss(model(x).float(), y)
    scaler.scale(loss).backward()
    if i in INF_AT:
        model[0].weight.grad[0, 0] = float("inf")  # an fp16 overflow in one gradient
    scale = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    if scaler.get_scale() < scale:  # the scale halves after a skipped step
        skipped.append(i)
with open(args.out, "w") as f:
    json.dump({"skipped": skipped, "steps": args.steps}, f)
print(f"skipped {skipped} of {args.steps} on {device}")
