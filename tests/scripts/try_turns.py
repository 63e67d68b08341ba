"""A loop starved by its DataLoader, for `trainprof try`'s rounds of turns (tryfix/turns): each
sample sleeps 5 ms in the dataset, 4 to a batch, and the step's own work is about 1 ms. With
num_workers=0 a step is about 21 ms; with two workers fetching side by side, about 10.
`--bind`: hold a fixed local port for the whole run, as a script with a hard-coded MASTER_PORT
does (a second copy at once fails). `--grads`: 10 ms more in each step whose zero_grad() left
the gradients in place (zero-grad-not-none saves them). `python try_turns.py [STEPS] [--bind]
[--grads]`."""

import socket
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200


class Slow(Dataset):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.005)
        return torch.full((8,), float(i % 7))


if __name__ == "__main__":
    if "--bind" in sys.argv:
        held = socket.socket()
        held.bind(("127.0.0.1", 29517))
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Slow(), batch_size=4, num_workers=0)
    for i, x in enumerate(loader):
        if i == steps:
            break
        opt.zero_grad(set_to_none=False)
        if "--grads" in sys.argv and model.weight.grad is not None:
            time.sleep(0.01)
        model(x).sum().backward()
        opt.step()
    print(f"trained {steps} steps")
