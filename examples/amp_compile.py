"""Slow math: an fp32 CNN with a per-parameter optimizer and no kernel tuning.

The broken form trains in fp32, runs Adam one parameter at a time (``foreach=False``: a dozen
small kernels per parameter tensor), zero-fills every gradient before each step
(``zero_grad(set_to_none=False)``) and leaves ``cudnn.benchmark`` off. The fixed form uses mixed
precision (fp16 autocast + GradScaler on CUDA, bf16 autocast on CPU), channels-last memory,
the multi-tensor optimizer, ``set_to_none=True``, ``cudnn.benchmark`` and, on CUDA or with
``--compile``, ``torch.compile``.

    python examples/amp_compile.py                      # broken
    python examples/amp_compile.py --fixed              # AMP + foreach + ... (compile on CUDA)
    python examples/amp_compile.py --fixed --compile    # also torch.compile on CPU (slow start)
"""

from __future__ import annotations

import argparse

import torch
from _timing import StepClock  # examples/_timing.py: step timing without device syncs
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BATCH_SIZE = 32
NUM_CLASSES = 10



def make_model(width: int = 64, depth: int = 6) -> nn.Module:
    """A plain VGG-style CNN: enough conv math for precision to matter, many small parameters."""

    def block(cin: int, cout: int) -> list[nn.Module]:
        # bias=False: the BatchNorm right after subtracts the channel mean, bias included.
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    layers = block(3, width)
    for i in range(depth):
        layers += block(width, width)
        if i % 2 == 1:
            layers.append(nn.MaxPool2d(2))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, NUM_CLASSES)]
    return nn.Sequential(*layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120, help="training steps to run")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--fixed", action="store_true", help="apply the recommended fix")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="with --fixed: torch.compile on CPU too (on CUDA --fixed always compiles)",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)

    # Synthetic CIFAR-sized data, generated in memory: loading is not the problem here.
    n = args.steps * BATCH_SIZE
    dataset = TensorDataset(torch.randn(n, 3, 32, 32), torch.randint(0, NUM_CLASSES, (n,)))
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True, drop_last=True)

    model = make_model().to(device)
    if args.fixed:
        torch.backends.cudnn.benchmark = True  # FIX: let cuDNN time and pick the fastest conv algos
        # FIX: NHWC is the layout tensor cores / oneDNN (AMX) convs want under reduced precision.
        model = model.to(memory_format=torch.channels_last)
        # FIX: multi-tensor Adam: one fused kernel per op over all parameters, not one per tensor.
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
        # FIX: fp16 on CUDA needs loss scaling against underflow; bf16 (CPU) has fp32's range.
        amp_dtype = torch.float16 if cuda else torch.bfloat16
        scaler = torch.amp.GradScaler("cuda", enabled=cuda)
        if cuda or args.compile:
            # FIX: fuse the elementwise ops (BN, ReLU, casts) into fewer kernels. Off by default
            # on CPU only because compiling takes a while on a small machine.
            model = torch.compile(model)
    else:
        torch.backends.cudnn.benchmark = False  # PROBLEM: cuDNN uses heuristics, not the fastest
        # PROBLEM: foreach=False runs the Adam update one parameter tensor at a time.
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    criterion = nn.CrossEntropyLoss()

    clock = StepClock(device, args.steps)
    for step, (images, labels) in enumerate(clock.timed(loader)):
        images, labels = images.to(device), labels.to(device)
        if args.fixed:
            images = images.contiguous(memory_format=torch.channels_last)  # FIX: match the model
            optimizer.zero_grad(set_to_none=True)  # FIX: drop the grads; backward writes new ones
            # FIX: autocast runs convs/matmuls in fp16/bf16, keeps reductions and the loss in fp32.
            with torch.autocast(device.type, dtype=amp_dtype):
                loss = criterion(model(images), labels)
            scaler.scale(loss).backward()  # scaled against fp16 underflow (no-op when disabled)
            # Calls optimizer.step() unless fp16 grads overflowed. (Checking that reads one flag
            # from the GPU per step: a small sync, the accepted price of fp16 loss scaling.)
            scaler.step(optimizer)
            scaler.update()
        else:
            # PROBLEM: set_to_none=False zero-fills every gradient (one memset kernel per
            # parameter), then backward accumulates into them instead of just writing them.
            optimizer.zero_grad(set_to_none=False)
            loss = criterion(model(images), labels)  # PROBLEM: every conv and matmul in fp32
            loss.backward()
            optimizer.step()

        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.3f}")  # rare, deliberate sync for logging

    print(clock.summary("amp_compile", args.fixed))


if __name__ == "__main__":
    main()
