"""A CNN on MNIST-sized images (PyTorch's MNIST example, channels scaled by `--width`) trained
on FakeData 1x28x28 images, decoded (PIL -> tensor) per sample.

    loader.py --workers 0                 # the main process decodes every batch: starved
    loader.py --workers 4                 # workers keep up; batches still in pageable memory
    loader.py --workers 4 --pin           # pin_memory=True and .to(device, non_blocking=True)
    loader.py --workers 2 --cpus 3 --heavier 2   # every sample decoded twice, on 3 CPUs: the
                                                 # workers fill them and cannot keep up

The scenario needs a batch that takes about twice a training step to decode in one process
(starved with 0 workers, fed with 4) and a step long enough that receiving a batch from a worker
is a small part of it. Both depend on the machine's CPU and GPU, so `--calibrate` (plain python,
no trainprof) measures them and prints the `--width` and `--batch` that give it, as JSON.

    DEVICE=cpu python loader.py --calibrate --widths 8 16      # smoke test on a CPU
    DEVICE=cpu python loader.py --steps 12 --batch 8 --width 8 --workers 0
    DEVICE=cpu python loader.py --steps 12 --batch 8 --width 8 --workers 2 --cpus 3 --heavier 2
"""

import argparse
import json
import math
import os
import time

import torch
import torchvision
import torchvision.transforms as T
from torch import nn
from torch.utils.data import DataLoader

FETCH_S = 0.010  # target decode time of one batch in one process
STEP_SHARE = 0.5  # target step time, as a share of that


def make_model(width: int) -> nn.Module:
    half = max(width // 2, 1)
    return nn.Sequential(
        nn.Conv2d(1, half, 3), nn.ReLU(), nn.Conv2d(half, width, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Dropout(0.25), nn.Flatten(), nn.Linear(width * 144, 128), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(128, 10),
    )  # fmt: skip


def fake_data(n: int) -> torchvision.datasets.FakeData:
    return torchvision.datasets.FakeData(
        size=n, image_size=(1, 28, 28), num_classes=10, transform=T.ToTensor()
    )


class Heavier(torch.utils.data.Dataset):
    """`data` with every sample decoded `k` times: a pipeline k times as heavy per batch."""

    def __init__(self, data: torch.utils.data.Dataset, k: int) -> None:
        self.data, self.k = data, k

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        for _ in range(self.k - 1):
            self.data[i]
        return self.data[i]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_seconds(width: int, batch: int, device: torch.device) -> float:
    """A training step of make_model(width) on a batch already on the device, timed after the
    GPU finished (data loading left out)."""
    model = make_model(width).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    for i in range(25):
        if i == 5:  # after warm-up
            sync(device)
            t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    sync(device)
    return (time.perf_counter() - t0) / 20


def calibrate(device: torch.device, widths: list[int]) -> dict:
    data = fake_data(512)
    for i in range(32):  # warm-up
        data[i]
    t0 = time.perf_counter()
    for i in range(32, 288):
        data[i]
    per_sample = (time.perf_counter() - t0) / 256
    batch = max(8, min(1024, math.ceil(FETCH_S / per_sample)))
    step_s = {width: step_seconds(width, batch, device) for width in widths}
    target = batch * per_sample * STEP_SHARE
    width = min(widths, key=lambda w: abs(math.log(step_s[w] / target)))
    return {
        "width": width,
        "batch": batch,
        "fetch_ms_per_batch": round(batch * per_sample * 1e3, 3),
        "step_ms": {str(w): round(s * 1e3, 3) for w, s in step_s.items()},
    }


parser = argparse.ArgumentParser()
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--pin", action="store_true")
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--width", type=int, default=64)
parser.add_argument("--heavier", type=int, default=1, help="decode every sample K times")
parser.add_argument("--cpus", type=int, default=0, help="keep the script (and its workers) to "
                    "the first N CPUs it may use, as `taskset` would")
parser.add_argument("--calibrate", action="store_true")
parser.add_argument("--widths", type=int, nargs="*", default=[64, 128, 256, 512])
args = parser.parse_args()
device = torch.device(os.environ.get("DEVICE", "cuda"))
torch.manual_seed(0)
if args.calibrate:
    print(json.dumps(calibrate(device, args.widths)))
    raise SystemExit(0)

if args.cpus:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cpus])
loader = DataLoader(  # LOADER_LINE
    Heavier(fake_data(args.steps * args.batch), args.heavier),
    batch_size=args.batch,
    shuffle=True,
    num_workers=args.workers,
    persistent_workers=args.workers > 0,
    pin_memory=args.pin,
)
model = make_model(args.width).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for images, labels in loader:
    images = images.to(device, non_blocking=args.pin)  # COPY_LINE
    labels = labels.to(device, non_blocking=args.pin)  # LABELS_COPY
    loss = nn.functional.cross_entropy(model(images), labels)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
print(f"final loss {loss.item():.4f} on {device}, {args.workers} workers, pin={args.pin}")
