"""Data-loader starvation: the model waits for a single-process DataLoader.

Every sample is decoded from JPEG bytes and augmented (random resized crop, flip, colour jitter,
normalize) on the CPU. With ``num_workers=0`` that work runs in the training process, between
optimizer steps, and the model (the GPU, or the cores on a CPU run) idles while the next batch
is built.

    python examples/dataloader_starved.py            # broken: num_workers=0, pageable memory
    python examples/dataloader_starved.py --fixed    # workers + prefetch (+ pinned memory on CUDA)
"""

from __future__ import annotations

import argparse
import io
import os

import numpy as np
import torch
from _timing import StepClock  # examples/_timing.py: step timing without device syncs
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

BATCH_SIZE = 32



class JpegImages(Dataset):
    """Synthetic "JPEG folder": images are encoded once, decoded + augmented per sample."""

    def __init__(self, length: int, num_unique: int = 128, size: int = 160, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.length = length
        self.labels = rng.integers(0, 10, num_unique).tolist()
        self.blobs = []
        for _ in range(num_unique):
            # Upsampled noise looks more like a photo to the JPEG codec than raw noise does.
            small = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
            img = Image.fromarray(small).resize((size, size), Image.BILINEAR)
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=90)
            self.blobs.append(buf.getvalue())
        self.transform = v2.Compose(
            [
                v2.ToImage(),
                v2.RandomResizedCrop(96, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25]),
            ]
        )

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        j = index % len(self.blobs)
        img = Image.open(io.BytesIO(self.blobs[j])).convert("RGB")  # JPEG decode: per-sample CPU
        return self.transform(img), self.labels[j]  # augmentation: more per-sample CPU work


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))  # respects taskset / container CPU limits
    return os.cpu_count() or 2


def make_model() -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        # bias=False: the BatchNorm right after subtracts the channel mean, bias included.
        conv = nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False)
        return [conv, nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(
        *block(3, 32),
        *block(32, 64),
        *block(64, 128),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120, help="training steps to run")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--fixed", action="store_true", help="apply the recommended fix")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)

    dataset = JpegImages(length=args.steps * BATCH_SIZE)
    if args.fixed:
        cores = available_cores()
        if device.type == "cuda":
            num_workers = max(1, min(8, cores - 1))  # keep one core for the kernel-launching loop
        else:
            # On CPU the workers and the step's intra-op threads share the same cores: split them.
            # Oversubscribed OpenMP threads spin-wait and make the step slower than no workers.
            num_workers = max(1, cores // 2)
            torch.set_num_threads(max(1, cores - num_workers))  # FIX: one core each on 2 cores
        loader = DataLoader(
            dataset,
            batch_size=BATCH_SIZE,
            shuffle=True,
            drop_last=True,
            # FIX: decode + augment in worker processes, in parallel with the training step.
            num_workers=num_workers,
            # FIX: page-locked host batches make the host-to-device copy asynchronous (CUDA only;
            # on CPU there is no copy to speed up and pinning would be wasted work).
            pin_memory=device.type == "cuda",
            persistent_workers=True,  # FIX: don't re-fork the workers at every epoch
            prefetch_factor=4,  # FIX: each worker keeps 4 batches ready to absorb jitter
        )
    else:
        loader = DataLoader(
            dataset,
            batch_size=BATCH_SIZE,
            shuffle=True,
            drop_last=True,
            num_workers=0,  # PROBLEM: decode + augment run in the training loop, serially
            pin_memory=False,  # PROBLEM (CUDA): pageable memory makes .to(device) a blocking copy
        )

    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    clock = StepClock(device, args.steps)
    for step, (images, labels) in enumerate(clock.timed(loader)):
        # FIX: with pinned memory, non_blocking=True lets the copy overlap the previous step.
        images = images.to(device, non_blocking=args.fixed)
        labels = labels.to(device, non_blocking=args.fixed)

        loss = criterion(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            print(f"step {step}: loss {loss.item():.3f}")  # rare, deliberate sync for logging

    print(clock.summary("dataloader_starved", args.fixed))


if __name__ == "__main__":
    main()
