"""An in-memory TensorDataset MLP for `trainprof try`: Adam without foreach/fused, gradients zeroed
in place. `python try_mlp.py [STEPS] [--strict]`: --strict refuses DataLoader workers (a fix that
crashes the script)."""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

steps = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 40
torch.manual_seed(0)
data = TensorDataset(torch.randn(2048, 32), torch.randint(0, 10, (2048,)))
loader = DataLoader(data, batch_size=32, shuffle=True)
if "--strict" in sys.argv and loader.num_workers:
    raise RuntimeError(f"this script needs num_workers=0, got {loader.num_workers}")
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
done = 0
while done < steps:
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        done += 1
        if done == steps:
            break
print(f"trained {done} steps, loss {loss.item():.3f}")
