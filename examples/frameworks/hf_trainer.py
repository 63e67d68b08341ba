"""A Hugging Face Trainer run (a small BERT built from a config: no download).

PROBLEM 1: `TrainingArguments(dataloader_num_workers=0)` (the default) with a per-sample
tokenisation-like cost in the dataset: the step waits for data.
PROBLEM 2: `logging_steps=1`: the Trainer reads the loss on the host every step.

    python examples/frameworks/hf_trainer.py [--fixed] [--steps N]
    trainprof run examples/frameworks/hf_trainer.py
"""

import argparse
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Reviews(Dataset):
    """Random token ids; __getitem__ does per-sample work, as a tokenizer on the fly would."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, 1000, (n, 32), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        ids = self.ids[i].clone()
        for _ in range(10):  # stand-in for tokenisation + truncation + masking of one text
            ids = torch.where(torch.rand(ids.shape) < 0.01, torch.full_like(ids, 4), ids)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.labels[i]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixed", action="store_true")
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    torch.manual_seed(0)
    config = BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=128, vocab_size=1000, max_position_embeddings=32)
    model = BertForSequenceClassification(config)
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=16,
            # PROBLEM 1 / FIX: worker processes prepare the batches while the model trains
            dataloader_num_workers=2 if args.fixed else 0,
            dataloader_persistent_workers=args.fixed,
            logging_steps=50 if args.fixed else 1,  # PROBLEM 2 / FIX: log rarely
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
        )
        Trainer(model=model, args=targs, train_dataset=Reviews(4096)).train()


if __name__ == "__main__":
    main()
