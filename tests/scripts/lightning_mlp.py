"""A tiny Lightning MLP: automatic optimization runs training_step and backward inside
optimizer.step(closure). `lightning_mlp.py val` also validates every 5 steps (20 batches);
`--pl-profiler DIR` runs Lightning's own PyTorchProfiler, writing its traces into DIR."""

import sys

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    """One sample per __getitem__ (num_workers=0): fetching costs a noticeable share."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(n)
        self.x = torch.randn(n, 32, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        noise = torch.randn(self.x.shape[1])  # a per-sample augmentation
        return (self.x[i] + 0.01 * noise).clamp(-3.0, 3.0), self.y[i] * 1.0


class MLP(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                                 nn.Linear(128, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)  # a tiny model: threads only contend on a busy machine
    validate = "val" in sys.argv[1:]
    profiler = None
    if "--pl-profiler" in sys.argv:
        from pytorch_lightning.profilers import PyTorchProfiler

        where = sys.argv[sys.argv.index("--pl-profiler") + 1]
        profiler = PyTorchProfiler(dirpath=where, filename="pl", export_to_chrome=True)
    train = DataLoader(Samples(2048), batch_size=32, shuffle=True)
    val = DataLoader(Samples(640), batch_size=32) if validate else None
    trainer = pl.Trainer(
        max_steps=16,
        enable_progress_bar=False,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        accelerator="cpu",
        num_sanity_val_steps=0,
        val_check_interval=5 if validate else None,
        limit_val_batches=20 if validate else 0,
        profiler=profiler,
    )
    trainer.fit(MLP(), train, val)
    print("done")
