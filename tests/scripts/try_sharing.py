"""A loader whose workers keep up (the receiving kind of dataloader-starvation), for `trainprof
try`: 2 workers, each batch several small tensors. `python try_sharing.py [STEPS]`. It prints,
once, the tensor sharing strategy of its own process and of the worker that made the batch."""

import sys

import torch
import torch.multiprocessing
from torch.utils.data import DataLoader, Dataset


class Small(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        # A worker's strategy decides how it sends the batch's tensors (reductions.py).
        strategy = torch.multiprocessing.get_sharing_strategy()
        return torch.full((8,), float(i % 5)), torch.zeros(4), strategy


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Small(), batch_size=16, num_workers=2)
    for done, (x, _, worker) in enumerate(loader, 1):
        if done == 1:
            main = torch.multiprocessing.get_sharing_strategy()
            print(f"sharing strategy: main={main} worker={worker[0]}", flush=True)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if done == steps:
            break
