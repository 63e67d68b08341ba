"""No nn.Module, no optimizer, no DataLoader: a functional model and a manual update."""

import torch

w = torch.randn(4, 1, requires_grad=True)
for _ in range(7):
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    loss = ((x @ w - y) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        w -= 0.01 * w.grad
        w.grad = None
