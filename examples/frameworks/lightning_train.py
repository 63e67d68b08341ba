"""A PyTorch Lightning training run with the two problems Lightning users hit most.

PROBLEM 1: `self.log("train_loss", loss, prog_bar=True)` every step: Lightning reads the loss on
the host each step (`convert_tensors_to_scalars`), a device sync on a GPU.
PROBLEM 2: a per-sample augmentation in a DataLoader with `num_workers=0`: the step waits for data.
Validation runs every 20 steps inside `trainer.fit()` (trainprof keeps those steps out of the
training-step statistics).

    python examples/frameworks/lightning_train.py [--fixed] [--steps N]
    trainprof run examples/frameworks/lightning_train.py
"""

import argparse

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Noisy(Dataset):
    """Feature vectors with a per-sample augmentation (the kind of work a worker should do)."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 256, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        x = self.x[i]
        for _ in range(8):  # an augmentation pipeline: a few small ops per sample
            x = (x + 0.01 * torch.randn_like(x)).clamp(-3.0, 3.0)
        return x, self.y[i]


class Classifier(pl.LightningModule):
    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.fixed = fixed
        self.net = nn.Sequential(
            nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        if self.fixed:  # FIX: aggregate on the device, log once per epoch
            self.log("train_loss", loss, on_step=False, on_epoch=True)
        else:  # PROBLEM 1: read on the host every step
            self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixed", action="store_true")
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    torch.manual_seed(0)
    workers = dict(num_workers=2, persistent_workers=True) if args.fixed else {}  # FIX 2
    train = DataLoader(Noisy(8192, 0), batch_size=64, shuffle=True, **workers)  # PROBLEM 2
    val = DataLoader(Noisy(1024, 1), batch_size=64, **workers)
    trainer = pl.Trainer(
        max_steps=args.steps,
        accelerator="auto",
        devices=1,
        val_check_interval=20,
        limit_val_batches=8,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    trainer.fit(Classifier(args.fixed), train, val)


if __name__ == "__main__":
    main()
