"""A small MLP under `torch.compile(mode="reduce-overhead")`: after a few warm-up calls its
forward and backward are replayed as CUDA graphs (one cudaGraphLaunch each instead of one launch
per kernel). The optimizer (foreach Adam) stays eager.

    DEVICE=cpu python compiled_graphs.py --steps 12 --width 64     # smoke test (no CUDA graphs)
"""

import argparse
import os

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--width", type=int, default=512)
args = parser.parse_args()
device = torch.device(os.environ.get("DEVICE", "cuda"))
torch.manual_seed(0)

w = args.width
model = nn.Sequential(
    nn.Linear(w, w), nn.GELU(), nn.LayerNorm(w), nn.Linear(w, w), nn.GELU(), nn.LayerNorm(w),
    nn.Linear(w, 10),
).to(device)  # fmt: skip
compiled = torch.compile(model, mode="reduce-overhead")
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(256, w, device=device)
y = torch.randint(0, 10, (256,), device=device)
for _ in range(args.steps):
    torch.compiler.cudagraph_mark_step_begin()  # a new iteration: earlier outputs may be reused
    loss = nn.functional.cross_entropy(compiled(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
print(f"final loss {loss.item():.4f} on {device}")
