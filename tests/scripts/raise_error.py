"""Runs a few steps, then fails inside a function: the traceback must look like Python's."""

import torch
from torch import nn


def broken_eval(model: nn.Module) -> None:
    raise ValueError("boom from the script")  # RAISE_LINE


model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(6):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
broken_eval(model)
