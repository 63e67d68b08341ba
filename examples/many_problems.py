"""Many problems at once: a training loop with seven common slow-downs, to exercise the ranking.

Planted problems (each marked ``PROBLEM`` below):
  1. ``num_workers=0`` with a CPU-heavy per-sample transform (JPEG decode + augmentation),
  2. ``print(loss.item())`` every step (a host sync per step),
  3. ``if torch.isnan(loss):`` every step (``aten::is_nonzero``: another sync),
  4. a host tensor (class weights) built every step and copied to the device,
  5. ``foreach=False``: the optimizer updates one parameter tensor at a time,
  6. ``zero_grad(set_to_none=False)``: a memset per gradient, then accumulation into it,
  7. convolutions with a bias right before BatchNorm (wasted work: BatchNorm removes it).

    python examples/many_problems.py            # broken
    python examples/many_problems.py --fixed    # all seven fixed
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
NUM_CLASSES = 10
# Inverse class frequencies of some imbalanced data set, used to weight the loss.
CLASS_WEIGHTS = [0.5, 0.8, 1.0, 1.0, 1.2, 1.5, 0.9, 1.1, 2.0, 1.0]
LOG_EVERY = 25



class JpegImages(Dataset):
    """Synthetic "JPEG folder": images are encoded once, decoded + augmented per sample."""

    def __init__(self, length: int, num_unique: int = 128, size: int = 128, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.length = length
        self.labels = rng.integers(0, NUM_CLASSES, num_unique).tolist()
        self.blobs = []
        for _ in range(num_unique):
            # Upsampled noise looks more like a photo to the JPEG codec than raw noise does.
            small = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(small).resize((size, size), Image.BILINEAR).save(buf, format="JPEG")
            self.blobs.append(buf.getvalue())
        self.transform = v2.Compose(
            [
                v2.ToImage(),
                v2.RandomResizedCrop(48, antialias=True),
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
        img = Image.open(io.BytesIO(self.blobs[j])).convert("RGB")
        return self.transform(img), self.labels[j]


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))  # respects taskset / container CPU limits
    return os.cpu_count() or 2


def make_model(conv_bias: bool, width: int = 32) -> nn.Module:
    def block(cin: int, cout: int, stride: int) -> list[nn.Module]:
        conv = nn.Conv2d(cin, cout, 3, stride, padding=1, bias=conv_bias)
        return [conv, nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(
        *block(3, width, 2),
        *block(width, width, 1),
        *block(width, 2 * width, 2),
        *block(2 * width, 2 * width, 1),
        *block(2 * width, 4 * width, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, NUM_CLASSES),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=160, help="training steps to run")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--fixed", action="store_true", help="apply all the recommended fixes")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)

    dataset = JpegImages(length=args.steps * BATCH_SIZE)
    # PROBLEM 7 / FIX 7: a conv bias right before BatchNorm is computed, back-propagated and
    # updated for nothing (BatchNorm subtracts the channel mean, bias included): bias=False.
    model = make_model(conv_bias=not args.fixed).to(device)
    if args.fixed:
        cores = available_cores()
        if cuda:
            num_workers = max(1, min(8, cores - 1))  # keep one core for the kernel-launching loop
        else:
            num_workers = max(1, cores // 2)
            # On CPU the workers and the step's intra-op threads share the cores: split them,
            # or the oversubscribed OpenMP threads make the step slower than no workers at all.
            torch.set_num_threads(max(1, cores - num_workers))
        loader = DataLoader(
            dataset,
            batch_size=BATCH_SIZE,
            shuffle=True,
            drop_last=True,
            num_workers=num_workers,  # FIX 1: decode + augment in parallel with the step
            pin_memory=cuda,  # FIX 1: page-locked batches -> asynchronous host-to-device copies
            persistent_workers=True,
            prefetch_factor=4,
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)  # FIX 5
        # FIX 4: build constant tensors once, directly on the device.
        class_weights = torch.tensor(CLASS_WEIGHTS, device=device)
        running_loss = torch.zeros((), device=device)  # FIX 2: sum the loss on the device
        nonfinite = torch.zeros((), dtype=torch.bool, device=device)  # FIX 3: NaN flag on device
    else:
        # PROBLEM 1: the CPU-heavy transform runs serially in the training loop.
        loader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True, drop_last=True)
        # PROBLEM 5: one small kernel per op per parameter tensor instead of multi-tensor ops.
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)

    clock = StepClock(device, args.steps)
    for step, (images, labels) in enumerate(clock.timed(loader)):
        images = images.to(device, non_blocking=args.fixed)  # FIX 1: async with pinned memory
        labels = labels.to(device, non_blocking=args.fixed)

        if args.fixed:
            optimizer.zero_grad(set_to_none=True)  # FIX 6: backward writes fresh gradients
        else:
            # PROBLEM 6: zero-fills every gradient (a memset per parameter), then accumulates.
            optimizer.zero_grad(set_to_none=False)
            # PROBLEM 4: a new host tensor every step, plus a host-to-device copy.
            class_weights = torch.tensor(CLASS_WEIGHTS).to(device)

        loss = nn.functional.cross_entropy(model(images), labels, weight=class_weights)

        if args.fixed:
            # FIX 3: record non-finite losses on the device; check the flag when logging.
            nonfinite |= ~torch.isfinite(loss.detach())
        elif torch.isnan(loss):  # PROBLEM 3: `if tensor` waits for the GPU (aten::is_nonzero)
            raise RuntimeError(f"loss is NaN at step {step}")

        loss.backward()
        optimizer.step()

        if args.fixed:
            running_loss += loss.detach()
            if (step + 1) % LOG_EVERY == 0:
                # FIX 2 + 3: one sync every LOG_EVERY steps for both the log and the NaN check.
                if nonfinite.item():
                    raise RuntimeError(f"non-finite loss before step {step + 1}")
                print(f"step {step + 1}: mean loss {running_loss.item() / LOG_EVERY:.4f}")
                running_loss.zero_()
        else:
            print(f"step {step}: loss {loss.item():.4f}")  # PROBLEM 2: a sync every step

    print(clock.summary("many_problems", args.fixed))


if __name__ == "__main__":
    main()
