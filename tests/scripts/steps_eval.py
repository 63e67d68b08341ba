"""A plain loop that evaluates every 4 steps: model.eval() + no_grad over a validation loader
(16 batches). A frozen teacher in eval mode, run without grad in every step, is not evaluation.
Usage: steps_eval.py [--no-eval] [--teacher]"""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
evaluate = "--no-eval" not in sys.argv
teacher = nn.Linear(32, 1).eval() if "--teacher" in sys.argv else None
train = DataLoader(TensorDataset(torch.randn(12 * 16, 32), torch.randn(12 * 16, 1)), batch_size=16)
val = DataLoader(TensorDataset(torch.randn(16 * 16, 32), torch.randn(16 * 16, 1)), batch_size=16)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i, (x, y) in enumerate(train):
    if teacher is not None:
        with torch.no_grad():
            y = y + 0.1 * teacher(x)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    if evaluate and i % 4 == 3:  # after steps 3, 7, 11: in steps 4, 8 and the unfinished 12
        model.eval()
        with torch.no_grad():
            val_loss = sum(nn.functional.mse_loss(model(vx), vy) for vx, vy in val)
        model.train()
print("done")
