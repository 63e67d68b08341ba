"""Trains until stopped, with DataLoader worker processes, like a rank that torchrun stops with
SIGTERM (sent to its whole process group) after another rank failed. Prints READY after 6 steps.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1))
loader = DataLoader(data, batch_size=4, num_workers=2, persistent_workers=True)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
while True:
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        step += 1
        if step == 6:
            print("READY", flush=True)
