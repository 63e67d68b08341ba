"""DDP on every local GPU (NCCL), run by torchrun: a ResNet-18-sized conv net on random images,
20 steps. With DEVICE=cpu it runs on gloo (smoke test of the script itself).

    trainprof run --nproc-per-node 2 ddp_two.py
"""

import argparse
import os

import torch
import torch.distributed as dist
import torchvision
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--size", type=int, default=128)
args = parser.parse_args()
cuda = os.environ.get("DEVICE", "cuda") == "cuda"
local = int(os.environ.get("LOCAL_RANK", "0"))
dist.init_process_group("nccl" if cuda else "gloo")
device = torch.device("cuda", local) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)
rank = dist.get_rank()
torch.manual_seed(rank)

model = torchvision.models.resnet18(num_classes=10).to(device)
model = DistributedDataParallel(model, device_ids=[local] if cuda else None)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(args.batch, 3, args.size, args.size, device=device)
y = torch.randint(0, 10, (args.batch,), device=device)
for _ in range(args.steps):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()  # DDP all-reduces the gradients here
    opt.step()
print(f"rank {rank} done: {args.steps} steps on {device}, loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
