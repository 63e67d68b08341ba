"""Two optimizers per iteration (GAN-style): one step per iteration, not per optimizer."""

import torch
from torch import nn

gen, disc = nn.Linear(4, 8), nn.Linear(8, 1)
opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
opt_d = torch.optim.SGD(disc.parameters(), lr=1e-2)
for _ in range(6):
    fake = gen(torch.randn(16, 4))
    opt_d.zero_grad()
    d_loss = disc(torch.randn(16, 8)).mean() - disc(fake.detach()).mean()
    d_loss.backward()
    opt_d.step()
    opt_g.zero_grad()
    g_loss = -disc(fake).mean()
    g_loss.backward()
    opt_g.step()
