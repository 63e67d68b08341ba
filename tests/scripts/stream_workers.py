"""An IterableDataset read from data (a list), under a DataLoader with 2 workers. `split`: its
__iter__ splits the list between the workers; `plain`: every worker yields all of it (the
documentation's pitfall); `random`: samples drawn in the workers (seeded apart by torch)."""

import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

KIND = sys.argv[1] if len(sys.argv) > 1 else "plain"
DATA = [torch.full((8,), float(i)) for i in range(400)]


class Rows(IterableDataset):
    def __iter__(self):
        if KIND == "random":
            return (torch.randn(8) for _ in range(len(DATA)))
        if KIND == "split":
            info = get_worker_info()
            n, k = (1, 0) if info is None else (info.num_workers, info.id)
            return iter(DATA[k::n])
        return iter(DATA)


model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Rows(), batch_size=4, num_workers=2)
for x in loader:
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
