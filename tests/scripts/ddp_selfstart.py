"""A 2-rank gloo DDP loop whose script starts rank 1 itself: `python [-E] ddp_selfstart.py` with
RANK=1 and WORLD_SIZE=2 in its environment (as accelerate or torchrun called from a script do),
and runs rank 0 in its own process. With --isolated rank 1 is started with `python -E`, which
ignores PYTHONPATH: trainprof's start-up hook cannot reach it."""

import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def train(rank: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(rank)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(15):
        x, y = torch.randn(8, 16), torch.randn(8, 1)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    print(f"rank {rank} done: 15 steps", flush=True)
    # Both ranks past their last collective before either tears gloo down: without it, rank 1
    # (plain python, no trainprof) once aborted in the teardown ("terminate called without an
    # active exception", exit 250 through this script), 1 run in 12.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if os.environ.get("RANK") == "1":
        train(1)
        # Past the teardown, no interpreter shutdown: gloo's threads were still aborting it now
        # and then after the barrier ("terminate called without an active exception", exit 250
        # through this script, once in a fresh-clone make test), in this plain-python rank that
        # runs no trainprof code.
        sys.stdout.flush()
        os._exit(0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    flags = ["-E"] if "--isolated" in sys.argv else []
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2"}
    child = subprocess.Popen([sys.executable, *flags, os.path.abspath(__file__)], env=env)
    train(0)
    sys.exit(child.wait())
