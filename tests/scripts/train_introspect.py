"""Writes how it was run (argv, __name__, sys.path[0], cwd, the frames below it) to the JSON file
argv[1], after a short training loop with DataLoader workers (forked: trainprof's patches must
not break them, nor make them "bad forks" to torch) and a torchmetrics MeanMetric updated every
step."""

import json
import os
import sys
import traceback

import torch
import torchmetrics
from helper_mod import HIDDEN  # script-relative import
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def annotated(x: int) -> None:
    """Its annotation stays the class unless the script itself postpones annotations."""


class ForkState(TensorDataset):
    """Each item also says whether the worker that fetched it is a bad fork to torch (one that
    cannot initialise CUDA, and whose torch.manual_seed leaves CUDA alone)."""

    def __getitem__(self, i: int):
        return (*super().__getitem__(i), torch.tensor(torch.cuda._is_in_bad_fork()))


def main() -> None:
    data = ForkState(torch.randn(96, 8), torch.randn(96, 1))
    loader = DataLoader(data, batch_size=16, num_workers=2, persistent_workers=True)  # LOADER
    model = nn.Sequential(nn.Linear(8, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)  # OPT_LINE
    mean_loss = torchmetrics.MeanMetric(nan_strategy="warn")  # METRIC_LINE
    bad_forks = 0
    for x, y, bad in loader:
        bad_forks += int(bad.sum())
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        mean_loss.update(loss.detach())
    view = {
        "argv": sys.argv,
        "name": __name__,
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "file": __file__,
        "stack": [f"{f.filename}:{f.name}" for f in traceback.extract_stack()],
        "annotation": repr(annotated.__annotations__["x"]),
        "main_module": sys.modules["__main__"].__dict__ is globals(),
        "mean_loss": float(mean_loss.compute()),
        "bad_fork_items": bad_forks,
    }
    with open(sys.argv[1], "w") as f:
        json.dump(view, f)


if __name__ == "__main__":
    main()
