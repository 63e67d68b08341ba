"""A DDP job on CPU (gloo) whose rank 1 fetches slowly: each of its samples sleeps, so the job's
step waits for rank 1's fetch unless rank 1 has a DataLoader worker. The loop's compute is a
sleep too (a GPU's step as seen by the host), so the figures do not depend on the CPUs' speed.
Run under torchrun (`trainprof run --nproc-per-node 2`). Usage: try_ddp.py [--steps N]
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--fetch-ms", type=float, default=1.0, help="rank 1's sleep per sample")
parser.add_argument("--compute-ms", type=float, default=10.0)
args = parser.parse_args()

dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT come from torchrun
rank, world = dist.get_rank(), dist.get_world_size()
batch = 8


class Samples(Dataset):
    def __len__(self) -> int:
        return args.steps * batch * world

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if rank == 1:
            time.sleep(args.fetch_ms / 1000)  # decoding, augmenting: rank 1's data is slow
        return torch.full((16,), float(i % 7)), torch.ones(1)


torch.manual_seed(0)
sampler = DistributedSampler(Samples(), num_replicas=world, rank=rank, shuffle=False)
loader = DataLoader(Samples(), batch_size=batch, sampler=sampler, num_workers=0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(loader):
    if step == 0:  # what `trainprof try` set in this rank, for the tests
        print(f"rank {rank}: num_workers={loader.num_workers}", flush=True)
    opt.zero_grad()
    time.sleep(args.compute_ms / 1000)  # the model's work, off the CPUs
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()  # DDP all-reduces the gradients here: rank 0 waits for rank 1
    opt.step()
print(f"rank {rank} done: {step + 1} steps", flush=True)
dist.destroy_process_group()
