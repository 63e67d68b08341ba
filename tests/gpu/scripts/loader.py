"""An MNIST-sized CNN (PyTorch's MNIST example) trained on FakeData 1x28x28 images.

    loader.py --workers 0                 # the main process decodes every batch: starved
    loader.py --workers 4                 # workers keep up; batches still in pageable memory
    loader.py --workers 4 --pin           # pin_memory=True and .to(device, non_blocking=True)

The step is short (a small CNN: launching its kernels costs more than running them), and one
batch costs about two steps to decode in one process, so 4 workers keep up. No host reads in
the loop: the loss is read once at the end.

    DEVICE=cpu python loader.py --steps 12 --batch 8 --workers 0      # smoke test on a CPU
"""

import argparse
import os

import torch
import torchvision
import torchvision.transforms as T
from torch import nn
from torch.utils.data import DataLoader

parser = argparse.ArgumentParser()
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--pin", action="store_true")
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--batch", type=int, default=32)
args = parser.parse_args()
device = torch.device(os.environ.get("DEVICE", "cuda"))
torch.manual_seed(0)

data = torchvision.datasets.FakeData(
    size=args.steps * args.batch, image_size=(1, 28, 28), num_classes=10, transform=T.ToTensor()
)
loader = DataLoader(  # LOADER_LINE
    data,
    batch_size=args.batch,
    shuffle=True,
    num_workers=args.workers,
    persistent_workers=args.workers > 0,
    pin_memory=args.pin,
)
model = nn.Sequential(
    nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
    nn.Dropout(0.25), nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Dropout(0.5),
    nn.Linear(128, 10),
).to(device)  # fmt: skip
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for images, labels in loader:
    images = images.to(device, non_blocking=args.pin)  # COPY_LINE
    labels = labels.to(device, non_blocking=args.pin)
    loss = nn.functional.cross_entropy(model(images), labels)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
print(f"final loss {loss.item():.4f} on {device}, {args.workers} workers, pin={args.pin}")
