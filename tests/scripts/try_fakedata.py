"""A torchvision FakeData + ToTensor CNN, MNIST-sized, num_workers=0 (a workload for
`trainprof try` and benchmarks/fix_efficacy.py). `python try_fakedata.py [STEPS]`."""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
torch.manual_seed(0)
data = datasets.FakeData(size=64 * steps, image_size=(1, 28, 28), num_classes=10,
                         transform=transforms.ToTensor())
loader = DataLoader(data, batch_size=64, shuffle=True)
model = nn.Sequential(
    nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for step, (x, y) in enumerate(loader):  # noqa: B007 - printed after the loop
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"trained {step + 1} steps, loss {loss.item():.3f}")
