"""torch.multiprocessing.spawn of a 2-process gloo DDP loop on CPU, 15 steps per rank. The
script's own process runs no step: each spawned process runs `worker(rank, ...)`.

Usage: mp_spawn_ddp.py [--fail-rank R]: rank R raises at step 5."""

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def worker(rank: int, world: int, port: int, fail_rank: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(15):
        if rank == fail_rank and step == 5:
            raise RuntimeError(f"rank {rank} fails at step {step}")
        x, y = torch.randn(8, 16), torch.randn(8, 1)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    print(f"rank {rank} done: 15 steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=-1)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, port, args.fail_rank), nprocs=2)
