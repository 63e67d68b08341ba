"""ResNet-18 (batch 128, 224x224 random images from an in-memory Dataset) tracking the mean loss
with a TorchMetrics MeanMetric updated every step.

Broken: `MeanMetric()` at its defaults: `nan_strategy="warn"` runs `if nans.any()` on every
update and the default `weight=1.0` becomes a host-to-device copy: host syncs every step.
--fixed: `MeanMetric(nan_strategy="disable")` and a weight tensor made once on the device.
Everything else (loader, model, optimizer) is the same in both forms.

    DEVICE=cpu python metric_sync.py --steps 12 --batch 4 --size 64   # smoke test on a CPU
"""

import argparse
import os

import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchmetrics import MeanMetric


class InMemoryImages(Dataset):
    """`length` samples drawn from a pool of uint8 images held in memory (decoded-JPEG-like)."""

    def __init__(self, length: int, size: int, pool: int = 256) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (pool, 3, size, size), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 1000, (pool,), generator=g)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        j = i % len(self.labels)
        return self.images[j], self.labels[j]


parser = argparse.ArgumentParser()
parser.add_argument("--fixed", action="store_true")
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--batch", type=int, default=128)
parser.add_argument("--size", type=int, default=224)
args = parser.parse_args()
device = torch.device(os.environ.get("DEVICE", "cuda"))
cuda = device.type == "cuda"
torch.manual_seed(0)

loader = DataLoader(
    InMemoryImages(args.steps * args.batch, args.size),
    batch_size=args.batch,
    shuffle=False,
    num_workers=0,
    pin_memory=cuda,
)
model = torchvision.models.resnet18(num_classes=1000).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
criterion = nn.CrossEntropyLoss()
if args.fixed:
    loss_metric = MeanMetric(nan_strategy="disable").to(device)
    weight = torch.ones((), device=device)  # once, on the device: no per-update copy
else:
    loss_metric = MeanMetric().to(device)  # defaults: nan_strategy="warn", weight=1.0

for images, labels in loader:
    images = images.to(device, non_blocking=cuda).float().div_(255)
    labels = labels.to(device, non_blocking=cuda)
    loss = criterion(model(images), labels)
    if args.fixed:
        loss_metric.update(loss.detach(), weight=weight)
    else:
        loss_metric.update(loss.detach())  # METRIC_LINE
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
print(f"mean loss {loss_metric.compute().item():.4f} on {device}")
