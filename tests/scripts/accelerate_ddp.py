"""An Accelerate training loop on CPU, 30 steps per process. Run it with
`accelerate launch --multi_gpu --num_processes 2 accelerate_ddp.py`: on a machine without GPUs
the launcher still runs torchrun's agent, which starts the ranks (`python -u accelerate_ddp.py`,
RANK set), and they use gloo."""

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

acc = Accelerator(cpu=True)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = DataLoader(TensorDataset(torch.randn(480, 16), torch.randn(480, 1)), batch_size=8)
model, opt, data = acc.prepare(model, opt, data)
print(f"rank {acc.process_index}: num_workers={data.num_workers}", flush=True)  # `try` sets it
for x, y in data:
    opt.zero_grad()
    acc.backward(nn.functional.mse_loss(model(x), y))
    opt.step()
print(f"rank {acc.process_index} of {acc.num_processes} done", flush=True)
