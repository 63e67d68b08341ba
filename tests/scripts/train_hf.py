"""A tiny Hugging Face Trainer run: a randomly initialised BERT built from a config (no download),
random token ids read by a slow dataset. Usage: train_hf.py OUTDIR."""

import sys
import time

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Tokens(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 100, (n, 16), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        time.sleep(0.003)  # a slow per-sample transform: the DataLoader starves the step
        # A mask without padding: transformers checks it on the host (`padding_mask.all()`).
        mask = torch.ones_like(self.ids[i])
        return {"input_ids": self.ids[i], "attention_mask": mask, "labels": self.labels[i]}


torch.manual_seed(0)
config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=37, vocab_size=100, max_position_embeddings=32)
model = BertForSequenceClassification(config)
args = TrainingArguments(output_dir=sys.argv[1], max_steps=20, per_device_train_batch_size=8,
                         report_to=[], use_cpu=True, save_strategy="no", logging_steps=5,
                         disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=Tokens(320))
trainer.train()  # TRAIN_LINE
