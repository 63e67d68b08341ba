"""A training loop that starts Python processes which are not ranks: `python -c`, this script
as a helper (`--helper`), and DataLoader workers of the "spawn" start method. None of them is
profiled, and their output is their own."""

import subprocess
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    if sys.argv[1:] == ["--helper"]:
        print("helper ran", flush=True)
        sys.exit(0)
    subprocess.run([sys.executable, "-c", "print(1)"], check=True)
    subprocess.run([sys.executable, __file__, "--helper"], check=True)
    data = TensorDataset(torch.randn(96, 8), torch.randn(96, 1))
    loader = DataLoader(data, batch_size=8, num_workers=1, multiprocessing_context="spawn")
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    print("done", flush=True)
