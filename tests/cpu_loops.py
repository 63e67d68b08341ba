"""Real small CPU training loops for the rule tests, recorded by tests/cpu_trace.py through the
session fixtures of tests/conftest.py (`cpu_bad`, `cpu_good`, `cpu_recompiling`, ...).

CPU recordings vary in timing from run to run, so the tests on them assert counts, locations and
how each saving follows from the measured time, not the times themselves.
"""

from __future__ import annotations

from cpu_trace import line_of

from trainprof.runmeta import CpuBf16, Flags, OptimizerInfo, OptimizerProbe, RunMeta, Window

# Every problem of issue 4 part B that a CPU can show, in one small loop.
BAD = """
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1),  # CONV: bias=True (the default) right before a BatchNorm
    nn.BatchNorm2d(8),
    nn.ReLU(),
    nn.Flatten(),
    nn.Linear(8 * 16 * 16, 10),
)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=False)  # OPTIMIZER
losses = []


def step(i):
    x = torch.randn(16, 3, 16, 16)
    y = torch.randint(0, 10, (16,))
    weight = torch.tensor([1.0] * 10)  # a host tensor per step: harmless on CPU
    loss = F.cross_entropy(model(x), y, weight=weight)
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
    print(f"step {i} loss {loss.item():.3f}")
    losses.append(loss.item())
"""

# The same loop with every one of those fixed.
GOOD = """
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1, bias=False),
    nn.BatchNorm2d(8),
    nn.ReLU(),
    nn.Flatten(),
    nn.Linear(8 * 16 * 16, 10),
)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True)
weight = torch.ones(10)
total = torch.zeros(())


def step(i):
    global total
    x = torch.randn(16, 3, 16, 16)
    y = torch.randint(0, 10, (16,))
    loss = F.cross_entropy(model(x), y, weight=weight)
    opt.zero_grad()
    loss.backward()
    opt.step()
    total = total + loss.detach()
    if (i + 1) % 100 == 0:
        print(f"mean loss {total.item() / 100:.3f}")
"""

# torch.compile with the eager backend (fast on 2 cores, same Dynamo guards and recompiles).
COMPILED = """
import torch


def scaled(x):
    y = x.sin()
    print("shape", y.shape)  # a graph break: the rest is a second compiled frame
    return y.cos().sum()


fn = torch.compile(scaled, backend="eager", dynamic={dynamic})


def step(i):
    return fn(torch.randn({length}))
"""
RECOMPILING = COMPILED.format(dynamic="False", length="8 + i")  # a new length every step
SETTLING = COMPILED.format(dynamic="None", length="8 + i")  # automatic dynamic shapes
STABLE = COMPILED.format(dynamic="False", length="8")

# A small CNN with BatchNorm and plain SGD (cpu-bf16's model-probe tests).
CNN = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(16 * 16 * 16, 10),
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))

def step(i):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""

# try_mlp's optimizer: Adam with foreach=False on a 4-tensor MLP.
ADAM = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
x, y = torch.randn(32, 32), torch.randint(0, 10, (32,))

def step(i):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""

STEP_LINE = line_of(BAD, "def step")
OPTIMIZER_AT = f"train.py:{line_of(BAD, '# OPTIMIZER')}"


def bf16_meta(
    probe: CpuBf16, parts: bool = True, fused: OptimizerProbe | None = None
) -> RunMeta:
    """CNN's run metadata for cpu-bf16's arithmetic: 12 steps of 10 ms, 2 of them fetching and 1
    in SGD.step (forward + backward: 70 %, with `parts`); steps 2-4 recorded, 5-11 unprofiled;
    `fused`: SGD ran fused=True already, timed so after the run."""
    n = 12
    return RunMeta(
        cpu_count=2, torch_threads=1, cpu_bf16=probe, step_source="optimizer",
        step_times_s=[0.010] * n,
        fetch_times_s=[0.002] * n if parts else [],
        optimizer_times_s={"SGD": [0.001] * n} if parts else {},
        optimizer_probe={} if fused is None else {"SGD": fused},
        window=Window(wait=1, warmup=1, active=3, recorded_steps=[2, 3, 4]),
    )  # fmt: skip


def bad_meta() -> RunMeta:
    """BAD's run metadata, as `trainprof run` would record it."""
    return RunMeta(
        optimizers=[
            OptimizerInfo(cls="torch.optim.sgd.SGD", foreach=False, location=OPTIMIZER_AT),
            # Built but never stepped in the window: only the metadata knows about it.
            OptimizerInfo(cls="torch.optim.adamw.AdamW", foreach=False, location="train.py:99"),
        ],
        flags=Flags(cudnn_benchmark=False),
    )
