"""Lightning DDP on CPU: Trainer(devices=2, strategy="ddp"). Lightning re-launches this script
for rank 1 as `python lightning_ddp.py` (LOCAL_RANK=1 in its environment). Each rank says what
its training DataLoader has when training starts (what `trainprof try` set in that rank).
Usage: lightning_ddp.py [--steps N]
"""

import argparse

import torch
from pytorch_lightning import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=15)
args = parser.parse_args()


class Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def on_train_start(self) -> None:
        loader = self.trainer.train_dataloader
        print(f"rank {self.global_rank}: num_workers={loader.num_workers}", flush=True)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    torch.manual_seed(0)
    n = max(640, 16 * args.steps)
    data = TensorDataset(torch.randn(n, 16), torch.randn(n, 1))
    trainer = Trainer(
        devices=2, strategy="ddp", accelerator="cpu", max_steps=args.steps,
        enable_progress_bar=False, logger=False, enable_checkpointing=False,
        enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Model(), DataLoader(data, batch_size=8))
    print(f"rank {trainer.global_rank} done: {trainer.global_step} steps", flush=True)
