"""LBFGS: forward/backward run several times inside optimizer.step(closure)."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.LBFGS(model.parameters(), max_iter=4)


def make_closure(x: torch.Tensor, y: torch.Tensor):
    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    return closure


for _ in range(5):  # new data every step: each step iterates
    opt.step(make_closure(torch.randn(32, 4), torch.randn(32, 1)))
