"""A matmul-heavy MLP (Linear 4096x4096 layers, batch 4096) trained in fp32 with the default
float32_matmul_precision ("highest": TF32 off), or with `--amp`: bf16 autocast. The loss is
read every step (`loss.item()`), as a loop that logs it would: the host waits there on a busy
GPU, the time faster kernels can give back.

    DEVICE=cpu python matmul_fp32.py --steps 12 --width 64 --batch 32   # smoke test on a CPU
"""

import argparse
import os

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--amp", action="store_true")
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--batch", type=int, default=4096)
parser.add_argument("--width", type=int, default=4096)
parser.add_argument("--layers", type=int, default=6)
args = parser.parse_args()
device = torch.device(os.environ.get("DEVICE", "cuda"))
torch.manual_seed(0)

layers = []
for _ in range(args.layers):
    layers += [nn.Linear(args.width, args.width), nn.ReLU()]
model = nn.Sequential(*layers, nn.Linear(args.width, 10)).to(device)  # MODEL_LINE
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(args.batch, args.width, device=device)
y = torch.randint(0, 10, (args.batch,), device=device)
total = 0.0
for _ in range(args.steps):
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    total += loss.item()
print(f"mean loss {total / args.steps:.4f} on {device}, amp={args.amp}")
