"""A two-weight Linear trained under trainprof.profile() on a given dataset, with the run's two
intra-op threads: the CPU loop the DataLoader probes' tests run (tests/test_worker_pairs.py,
tests/test_phase_ref.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import trainprof


def train_linear(
    out: Path, data: Dataset, config: Path | None = None, val: Dataset | None = None
) -> trainprof.api.Run:
    """Batches of 8 of `data` (`val` first, as an evaluation pass), profiled with a short window
    (wait 1, warm-up 1, 2 recorded steps)."""
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the thread steps run first, whatever this machine has
    try:
        with trainprof.profile(out, show=False, wait=1, warmup=1, active=2, config=config) as run:
            if val is not None:  # an evaluation pass first: its loader is fetched first
                model.eval()
                with torch.no_grad():
                    for x, _ in DataLoader(val, batch_size=8):
                        model(x)
                model.train()
            for x, y in DataLoader(data, batch_size=8):
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
    finally:
        torch.set_num_threads(before)
    return run
