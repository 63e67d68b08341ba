"""A tiny HF Trainer run that evaluates every 5 steps (Trainer.evaluate between two steps)."""

import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments


class Pairs(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(n)
        self.x, self.y = torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i]}


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        out = self.lin(x)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    args = TrainingArguments(
        output_dir="hf_out",
        max_steps=16,
        eval_strategy="steps",
        eval_steps=5,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    Trainer(model=Regressor(), args=args, train_dataset=Pairs(256), eval_dataset=Pairs(64)).train()
    print("done")
