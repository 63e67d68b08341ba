"""The DDP TorchMetrics pitfall, for real, in one process: a metric on the CPU synchronised
through a process group without a CPU backend (what NCCL is) fails at compute() with
`RuntimeError: No backend type associated with device type cpu`. "cuda:gloo" gives that
group without a GPU. A few training steps first, so that a trace is captured.
"""

import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torchmetrics import MeanMetric

store = os.path.join(tempfile.mkdtemp(), "store")
dist.init_process_group("cuda:gloo", init_method=f"file://{store}", rank=0, world_size=1)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_metric = MeanMetric()  # on the CPU: its state is all-gathered at compute()
for _ in range(6):
    opt.zero_grad()
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    opt.step()
    loss_metric.update(loss.detach())
print(f"mean loss {loss_metric.compute():.4f}")  # COMPUTE_LINE
