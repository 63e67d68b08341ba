"""torch.multiprocessing.spawn of a 2-process gloo DDP loop on CPU, 15 steps per rank. The
script's own process runs no step: each spawned process runs `worker(rank, ...)`.

Usage: mp_spawn_ddp.py [--fail-rank R] [--steps N]: rank R raises at step 5."""

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset


def worker(rank: int, world: int, port: int, fail_rank: int, steps: int = 15) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(8 * steps, 16), torch.randn(8 * steps, 1))
    loader = DataLoader(data, batch_size=8)
    print(f"rank {rank}: num_workers={loader.num_workers}", flush=True)  # `try` sets it
    for step, (x, y) in enumerate(loader):
        if rank == fail_rank and step == 5:
            raise RuntimeError(f"rank {rank} fails at step {step}")
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    print(f"rank {rank} done: {steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, port, args.fail_rank, args.steps), nprocs=2)
