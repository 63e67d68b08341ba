"""A ResNet-18 on in-memory 64x64 batches whose SGD is fused=True already (a workload for
`trainprof try`, benchmarks/fix_efficacy.py): torch's fused CPU optimizers run several times
slower on channels-last weights, so `cpu-bf16`'s fix pays more in the model's own layout here
(analysis/bf16_layout). `python try_fused_cnn.py [STEPS]`."""

import sys

import torch
import torchvision
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=10)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True)
x, y = torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))
for _ in range(steps):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
print(f"trained {steps} steps, loss {loss.item():.3f}")
