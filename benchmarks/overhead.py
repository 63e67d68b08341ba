"""Overhead of `trainprof run` on a real CPU training loop.

    .venv/bin/python benchmarks/overhead.py [--pairs 3] [--steps 300] [--device cuda]

Runs the same 300-step MLP loop (DataLoader, Adam, a loss.item() per step) with plain `python`
and with `trainprof run` (default config: wait 5, warm-up 2, 3 recorded steps with stacks),
interleaved A B A B so that machine noise hits both alike. The loop times itself, which
separates trainprof's cost inside the loop from the fixed start-up (torch import, profiler
set-up, saving the trace, the diagnosis), and its median step leaves out what happens once or
between a few steps (the profiling window, saving its trace, the probes trainprof times between
steps): what each step of a long run pays. Prints the ratios, trainprof / plain: the median
of the per-pair ratios, and the ratio of the best run of each (the least disturbed by other
processes).

Then, in-process, the cost of each probe outside the profiling window (what every call pays
when trainprof is not recording): Tensor.item, a forward through nested modules, a DataLoader
fetch, a backward, each with and without trainprof's wrappers installed.

`--device` (default: cuda when torch sees a GPU, else cpu) runs the model, the probes' tensors
and the backward there; the batches are still fetched on the host and copied to the device
(pinned, non_blocking) every step, as a GPU training loop does. On a GPU the loop waits for the
device before it starts and before it stops its clock, so queued kernels are counted.

`--data fakedata` fetches torchvision's FakeData (1x28x28 images, ToTensor, 64 per batch) for a
small CNN instead: a dataset that seeds torch for every sample, which on a CUDA build with CUDA
not initialised formats the Python stack (torch.cuda._lazy_call). Its fetch pays for every
frame below the script, so it measures what trainprof's own frames cost (capture/handoff.py).
trainprof runs as the `trainprof` command installed beside this Python, as a user runs it
(`python -m trainprof` where there is none: two frames of runpy's more).

`--loop` runs the loop itself (that is what the two commands execute).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
LOOP_TIME = re.compile(r"^LOOP_SECONDS (\S+)$", re.M)
STEP_TIME = re.compile(r"^STEP_MEDIAN_SECONDS (\S+)$", re.M)


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _sync(device: str) -> None:
    """Wait for queued GPU work, so that a clock read after it counts that work."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def loop(steps: int, device: str, data_kind: str = "tensors") -> None:
    """The measured training loop: a few ms per step on a 2-core CPU (tensors), or FakeData
    and a small CNN (fakedata, about 25 ms)."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    torch.set_num_threads(1)  # steadier on a small shared machine than competing OpenMP threads
    cuda = device.startswith("cuda")
    if data_kind == "fakedata":
        from torchvision import datasets, transforms

        batch = 64
        data = datasets.FakeData(
            size=steps * batch, image_size=(1, 28, 28), transform=transforms.ToTensor()
        )
        model = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(16 * 14 * 14, 10),
        ).to(device)  # fmt: skip
    else:
        batch = 128
        data = TensorDataset(
            torch.randn(steps * batch, 256), torch.randint(0, 10, (steps * batch,))
        )
        model = nn.Sequential(
            nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        ).to(device)
    loader = DataLoader(data, batch_size=batch, shuffle=True, pin_memory=cuda)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    _sync(device)  # the model's copy to the device is set-up, not the loop
    t0 = time.perf_counter()
    total = 0.0
    steps_s, last = [], t0
    for x, y in loader:
        x, y = x.to(device, non_blocking=cuda), y.to(device, non_blocking=cuda)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        total += loss.item()  # a sync per step: the step's kernels end before the clock reads
        now = time.perf_counter()
        steps_s.append(now - last)
        last = now
    _sync(device)
    elapsed = time.perf_counter() - t0
    print(f"LOOP_SECONDS {elapsed:.6f}")
    # The typical step, without what happens once (the profiling window, saving its trace,
    # the probes trainprof runs between a few steps): what a long run pays per step.
    print(f"STEP_MEDIAN_SECONDS {statistics.median(steps_s):.6f}")
    print(f"mean loss {total / steps:.4f} on {device}", file=sys.stderr)


def _timed(cmd: list[str]) -> tuple[float, float, float]:
    """(loop seconds as printed by the loop, whole-process seconds, the loop's median step)."""
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr}")
    found = LOOP_TIME.search(done.stdout)
    if not found:
        sys.exit(f"no LOOP_SECONDS in the output of {' '.join(cmd)}")
    step = STEP_TIME.search(done.stdout)
    return float(found.group(1)), wall, float(step.group(1)) if step else float("nan")


def probe_costs(device: str, rounds: int = 6, repeat: int = 25) -> None:
    """ns per call outside the window, plain vs with trainprof's wrappers installed: short timed
    blocks (a few ms), the two alternated `rounds` times, best block of each kept, to see
    through a busy machine. On a GPU each timed block ends with a device sync."""
    import contextlib
    import timeit

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from trainprof.capture.patching import Patches
    from trainprof.capture.probes import install_probes
    from trainprof.capture.state import S
    from trainprof.capture.stepper import Stepper
    from trainprof.capture.userframe import UserCode

    torch.set_num_threads(1)
    scalar = torch.tensor(1.0, device=device)
    shallow = nn.Linear(8, 8).to(device)
    deep = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(16)])  # 49
    deep = deep.to(device)
    x = torch.randn(2, 8, device=device)
    loader = DataLoader(TensorDataset(torch.randn(10**7, 1)), batch_size=1)  # fetched on the host
    it = iter(loader)
    w = torch.randn(8, device=device, requires_grad=True)
    cases = {
        "Tensor.item()": (lambda: scalar.item(), 10_000),
        "forward, 1 module": (lambda: shallow(x), 1_000),
        "forward, 49 modules": (lambda: deep(x), 20),  # nested modules add nothing
        "DataLoader fetch": (lambda: next(it), 200),
        "backward()": (lambda: (w * 2).sum().backward(), 100),
    }

    @contextlib.contextmanager
    def trainprof_installed():
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.startswith("cuda"):  # as trainprof run profiles a GPU run
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=10**9, warmup=1, active=1),
        )
        patches = Patches()
        stepper = Stepper(prof)
        stepper.install(patches)
        install_probes(patches, stepper, UserCode())
        prof.start()
        S.enabled = True
        try:
            # Steps come from an optimizer, as in training: fetches and backward() do not step
            # the profiler (one prof.step() per training step is any schedule's cost).
            opt = torch.optim.SGD([w], lr=0.0)
            (w * 2).sum().backward()
            opt.step()
            yield
        finally:
            S.enabled = False
            prof.stop()
            patches.restore()

    best = {name: [float("inf"), float("inf")] for name in cases}
    for _ in range(rounds):
        for patched in (False, True):
            with trainprof_installed() if patched else contextlib.nullcontext():
                for name, (fn, n) in cases.items():

                    def block(fn=fn, n=n) -> None:
                        for _ in range(n):
                            fn()
                        _sync(device)  # the block's kernels are part of its time

                    t = min(timeit.repeat(block, number=1, repeat=repeat)) / n
                    best[name][patched] = min(best[name][patched], t)
    print(
        f"probe cost outside the window on {device}, per call "
        f"(best of {rounds}x{repeat} blocks):"
    )
    for name, (plain, patched) in best.items():
        extra = (patched - plain) * 1e9
        print(f"  {name:20s} {plain * 1e9:8.0f} ns -> {patched * 1e9:8.0f} ns ({extra:+.0f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--loop", action="store_true", help="run the loop itself")
    parser.add_argument("--probes-only", action="store_true", help="only the per-probe costs")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--data", choices=("tensors", "fakedata"), default="tensors")
    args = parser.parse_args()
    device = args.device or default_device()
    if args.loop:
        loop(args.steps, device, args.data)
        return
    if args.probes_only:
        probe_costs(device)
        return

    # The `trainprof` command beside this Python, as users run it; `python -m trainprof` (the
    # same code, two more frames below the script) where it was not installed.
    command = Path(sys.executable).with_name("trainprof")
    trainprof = [str(command)] if command.is_file() else [sys.executable, "-m", "trainprof"]
    script_args = [str(HERE), "--loop", "--steps", str(args.steps), "--device", device]
    script_args += ["--data", args.data]
    plain_cmd = [sys.executable, *script_args]
    with tempfile.TemporaryDirectory() as tmp:
        plain: list[tuple[float, float, float]] = []
        prof: list[tuple[float, float, float]] = []
        for i in range(args.pairs):
            plain.append(_timed(plain_cmd))
            out = os.path.join(tmp, f"run{i}")
            prof.append(_timed([*trainprof, "run", "--out", out, *script_args]))
            print(
                f"pair {i + 1}: loop {plain[-1][0]:.3f} s vs {prof[-1][0]:.3f} s, "
                f"process {plain[-1][1]:.2f} s vs {prof[-1][1]:.2f} s"
            )

    def paired(k: int) -> float:  # a pair ran back to back, under about the same load
        return statistics.median(b[k] / a[k] for a, b in zip(plain, prof, strict=True))

    def best(k: int) -> float:  # the least disturbed run of each
        return min(b[k] for b in prof) / min(a[k] for a in plain)

    per_step = statistics.median(p[0] for p in plain) / args.steps * 1e3
    print(
        f"steps: {args.steps} on {device} ({args.data}), plain step time {per_step:.2f} ms "
        f"(median of {args.pairs} runs); trainprof as `{' '.join(trainprof)}`"
    )
    print("ratio trainprof / plain       median of pairs   best run of each")
    print(f"  loop time (the script's)    {paired(0):6.3f}            {best(0):6.3f}")
    print(f"  whole process               {paired(1):6.3f}            {best(1):6.3f}")
    print(f"  median step                 {paired(2):6.3f}            {best(2):6.3f}")
    probe_costs(device)


if __name__ == "__main__":
    main()
