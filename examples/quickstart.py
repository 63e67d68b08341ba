"""Quickstart: a tiny CNN whose training loop waits on its own data loading.

The demo behind ``make demo`` (``trainprof run examples/quickstart.py``). Images are generated in
memory, then augmented per sample on the CPU inside a ``num_workers=0`` DataLoader, and the loss
is read back with ``loss.item()`` at every step. Runs in about 10 s on a 2-core CPU.

    python examples/quickstart.py            # broken
    python examples/quickstart.py --fixed    # worker processes, loss read back every 10 steps
"""

from __future__ import annotations

import argparse
import os

import torch
from _timing import StepClock  # examples/_timing.py: step timing without device syncs
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

BATCH_SIZE = 64
NUM_CLASSES = 10
LOG_EVERY = 10



class RandomImages(Dataset):
    """Generated uint8 images (no download); every sample is augmented on the CPU when read."""

    def __init__(self, length: int, size: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (256, 3, size, size), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, NUM_CLASSES, (256,), generator=g)
        self.length = length
        self.transform = v2.Compose(
            [
                v2.RandomResizedCrop(48, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.ColorJitter(brightness=0.3, contrast=0.3, saturation=0.3),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25]),
            ]
        )

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        j = index % len(self.images)
        return self.transform(self.images[j]), self.labels[j]  # per-sample CPU work


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))  # respects taskset / container CPU limits
    return os.cpu_count() or 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="training steps to run")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--fixed", action="store_true", help="apply the recommended fix")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)

    dataset = RandomImages(length=args.steps * BATCH_SIZE)
    if args.fixed:
        cores = available_cores()
        if cuda:
            num_workers = max(1, min(8, cores - 1))  # keep one core for the kernel-launching loop
        else:
            # CPU training: give the workers and the step's intra-op threads their own cores.
            num_workers = max(1, cores // 2)
            torch.set_num_threads(max(1, cores - num_workers))
        # FIX: augment in worker processes while the model trains on the previous batch.
        loader = DataLoader(
            dataset,
            batch_size=BATCH_SIZE,
            shuffle=True,
            drop_last=True,
            num_workers=num_workers,
            pin_memory=cuda,
            persistent_workers=True,
        )
    else:
        # PROBLEM: num_workers=0: the per-sample transform runs in the training loop itself.
        loader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True, drop_last=True)

    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, NUM_CLASSES),
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()

    clock = StepClock(device, args.steps)
    for step, (images, labels) in enumerate(clock.timed(loader)):
        images = images.to(device, non_blocking=args.fixed)
        labels = labels.to(device, non_blocking=args.fixed)
        loss = criterion(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if args.fixed:
            if (step + 1) % LOG_EVERY == 0:
                print(f"step {step + 1}: loss {loss.item():.3f}")  # FIX: one sync per 10 steps
        else:
            print(f"step {step}: loss {loss.item():.3f}")  # PROBLEM: .item() syncs every step

    print(clock.summary("quickstart", args.fixed))


if __name__ == "__main__":
    main()
