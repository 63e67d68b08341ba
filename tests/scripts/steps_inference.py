"""Inference only: no backward, no optimizer; steps are DataLoader batches."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.Linear(4, 2).eval()
loader = DataLoader(TensorDataset(torch.randn(28, 4)), batch_size=4)  # 7 batches
with torch.no_grad():
    for (x,) in loader:
        model(x).argmax(1).tolist()
