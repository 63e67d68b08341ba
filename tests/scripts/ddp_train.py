"""A tiny real DDP training loop on CPU (gloo): DistributedSampler + DataLoader, 15 steps.

Run it under torchrun (or `trainprof run --nproc-per-node N`). Usage:
ddp_train.py [--steps N] [--fail-rank R --fail-step S --fail-code C] [--slow-rank R --slow-ms M]:
rank R calls sys.exit(C) at step S (to test how a rank that dies is reported); --slow-rank R
sleeps M ms before every forward (a straggler: the other ranks wait for it in the all-reduce).
"""

import argparse
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=15)
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--fail-step", type=int, default=-1)
parser.add_argument("--fail-code", type=int, default=3)
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--slow-ms", type=float, default=30.0)
args = parser.parse_args()

dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT come from torchrun
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
batch = 8
n = args.steps * batch * world
data = TensorDataset(torch.randn(n, 16), torch.randn(n, 1))
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=batch, sampler=sampler, num_workers=0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(loader):
    if rank == args.fail_rank and step == args.fail_step:
        print(f"rank {rank} exits with code {args.fail_code} at step {step}", flush=True)
        sys.exit(args.fail_code)
    opt.zero_grad()
    if rank == args.slow_rank:
        time.sleep(args.slow_ms / 1000)  # host work outside any op: "Other" in the breakdown
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()  # DDP all-reduces the gradients here (gloo)
    opt.step()
print(f"rank {rank} done: {step + 1} steps, loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
