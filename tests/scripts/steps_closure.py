"""optimizer.step(closure) with a closure that sleeps: the closure's time is not the update's."""

import time

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def closure() -> torch.Tensor:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1))
    loss.backward()
    time.sleep(0.03)  # stands for a forward + backward far longer than the update
    return loss


for _ in range(6):
    opt.step(closure)
