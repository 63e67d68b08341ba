"""A tiny LightningModule trained with Trainer(profiler=...) on the CPU.

Usage: userprof_lightning.py PROFILER [MAX_STEPS] [DIRPATH] [WORKERS]: PROFILER is "pytorch" (the
string), "object" (PyTorchProfiler(dirpath=DIRPATH, filename="perf")) or "none"; WORKERS is the
DataLoader's num_workers (default 0).
"""

import sys

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

kind = sys.argv[1]
max_steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
dirpath = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "-" else None
workers = int(sys.argv[4]) if len(sys.argv) > 4 else 0


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(16, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if kind == "object":
    from pytorch_lightning.profilers import PyTorchProfiler

    profiler = PyTorchProfiler(dirpath=dirpath, filename="perf")
else:
    profiler = None if kind == "none" else kind
data = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
trainer = pl.Trainer(
    max_steps=max_steps,
    accelerator="cpu",
    profiler=profiler,
    enable_progress_bar=False,
    enable_model_summary=False,
    logger=False,
    enable_checkpointing=False,
)
trainer.fit(Tiny(), DataLoader(data, batch_size=8, num_workers=workers))
print("done", trainer.global_step)
