"""GradScaler skipping optimizer.step(): 8 iterations, the scaled gradients of iterations 2 and 5
are inf, so the scaler skips the optimizer there; every iteration is still a step."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
took = []
for i in range(8):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(torch.randn(4, 4)), torch.randn(4, 1))
    if i in (2, 5):
        loss = loss * float("inf")  # an fp16 overflow, as a GPU run would meet it
    scaler.scale(loss).backward()
    scale = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    took.append(scaler.get_scale() >= scale)  # the scale halves after a skipped step
assert [i for i, ok in enumerate(took) if not ok] == [2, 5], took  # the test relies on it
