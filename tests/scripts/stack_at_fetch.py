"""Writes the stack at its first sample, fetched in this process (num_workers=0), to the JSON
file argv[1], after a few training steps."""

import json
import sys
import traceback

import torch
from torch.utils.data import DataLoader, Dataset


class StackAtFetch(Dataset):
    stack: list[str] = []

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        if not StackAtFetch.stack:
            StackAtFetch.stack = [f"{f.filename}:{f.name}" for f in traceback.extract_stack()]
        return torch.ones(4)


model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in DataLoader(StackAtFetch(), batch_size=4):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
with open(sys.argv[1], "w") as f:
    json.dump(StackAtFetch.stack, f)
