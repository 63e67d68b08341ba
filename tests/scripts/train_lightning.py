"""A tiny Lightning run whose `self.log(..., prog_bar=True)` makes Lightning read the loss on
the host every step (logger connector: convert_tensors_to_scalars). Usage: train_lightning.py
LOGDIR."""

import sys
import time

import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    """Random samples behind a slow per-sample transform: the DataLoader starves the step."""

    def __init__(self, n: int) -> None:
        self.x, self.y = torch.randn(n, 16), torch.randn(n, 1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(0.002)
        return self.x[i], self.y[i]


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, prog_bar=True)  # LOG_LINE
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


torch.manual_seed(0)
trainer = pl.Trainer(
    max_steps=20,
    accelerator="cpu",
    enable_progress_bar=False,
    enable_checkpointing=False,
    enable_model_summary=False,
    logger=CSVLogger(sys.argv[1]),
    log_every_n_steps=1,
)
trainer.fit(Tiny(), DataLoader(Slow(640), batch_size=8))  # FIT_LINE
