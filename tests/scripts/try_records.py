"""A loop that records checkpoints and logs, as real training does, for `trainprof try`'s rounds.

Usage: try_records.py KIND FOLDER [STEPS [resume]]. KIND:
  torch      a plain loop: torch.save(state, FOLDER/ckpt.pt) every 5 steps, then torch.load of it
             (checked against the model: a script reading back what it just saved), and the loss
             to TensorBoard with SummaryWriter() (runs/<time>_<host> in the working folder);
  lightning  Lightning with its default logger (lightning_logs/ in the working folder) and
             ModelCheckpoint(dirpath=FOLDER/ckpt) every 5 steps, validating every 4 steps
             (each validation made slow: 50 ms);
  hf         the Hugging Face Trainer, output_dir=FOLDER/out, a checkpoint every 5 steps,
             evaluating every 4 steps (each evaluation made slow: 50 ms);
             `resume`: train(resume_from_checkpoint=True), from the last one there;
  accelerate accelerate with project_dir=FOLDER, automatic checkpoint naming and a total limit
             of 2 (older ones deleted): save_state() every 5 steps; `resume`: load_state() first;
  files      a plain loop writing through Python's own file calls: a log appended to with open()
             and a logging.FileHandler, numpy.save (read back), a JSON saved atomically (a
             temporary file in FOLDER, os.replace), pathlib's write_text; safetensors' save_file
             (read back) and a transformers model's save_pretrained, written from Rust; at the
             start it deletes the previous run's FOLDER/stale.txt and FOLDER/old/, which it
             writes again; at exit (atexit) it writes FOLDER/summary.txt.
"""

import os
import sys
import time

import torch
from torch import nn

kind, folder = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 15
torch.manual_seed(int.from_bytes(os.urandom(4), "little"))  # each run's weights its own
data = torch.utils.data.TensorDataset(torch.randn(4096, 16), torch.randint(0, 2, (4096,)))

if kind == "torch":
    model = nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    path = os.path.join(folder, "ckpt.pt")
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter()
    for step, (x, y) in enumerate(loader, 1):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        writer.add_scalar("loss", loss.item(), step)
        if step % 5 == 0:
            torch.save({"step": step, "weight": model.weight.detach().clone()}, path)
            back = torch.load(path)
            assert back["step"] == step and torch.equal(back["weight"], model.weight), "not mine"
        if step == steps:
            break
    writer.close()
elif kind == "lightning":
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(16, 2)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.cross_entropy(self.net(x), y)
            self.log("loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            time.sleep(0.05 / 4)  # 4 batches: a validation 50 ms longer than a training step
            x, y = batch
            self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    ckpt = ModelCheckpoint(dirpath=os.path.join(folder, "ckpt"), every_n_train_steps=5,
                           save_top_k=-1)
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", callbacks=[ckpt], log_every_n_steps=5,
                         enable_progress_bar=False, enable_model_summary=False,
                         val_check_interval=4, num_sanity_val_steps=0)
    val = torch.utils.data.DataLoader(torch.utils.data.Subset(data, range(32)), batch_size=8)
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8), val)
elif kind == "hf":
    from transformers import Trainer, TrainingArguments

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(16, 2)

        def forward(self, x, labels=None):
            logits = self.net(x)
            return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}

    class Samples(torch.utils.data.Dataset):
        def __init__(self, n: int, slow: float = 0.0) -> None:
            self.n, self.slow = n, slow

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> dict:
            time.sleep(self.slow)
            x, y = data[i]
            return {"x": x, "labels": y}

    args = TrainingArguments(output_dir=os.path.join(folder, "out"), max_steps=steps,
                             save_steps=5, per_device_train_batch_size=8, report_to=[],
                             use_cpu=True, logging_steps=5, eval_strategy="steps", eval_steps=4,
                             per_device_eval_batch_size=8)
    resume = len(sys.argv) > 4 and sys.argv[4] == "resume"
    trainer = Trainer(model=Net(), args=args, train_dataset=Samples(len(data)),
                      eval_dataset=Samples(32, slow=0.05 / 32))  # an evaluation 50 ms long
    trainer.train(resume_from_checkpoint=resume)
elif kind == "accelerate":
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    config = ProjectConfiguration(project_dir=folder, automatic_checkpoint_naming=True,
                                  total_limit=2)
    acc = Accelerator(cpu=True, project_config=config)
    model = nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = acc.prepare(model, opt, torch.utils.data.DataLoader(data, batch_size=8))
    if len(sys.argv) > 4 and sys.argv[4] == "resume":
        acc.load_state()
    for step, (x, y) in enumerate(loader, 1):
        opt.zero_grad()
        acc.backward(nn.functional.cross_entropy(model(x), y))
        opt.step()
        if step % 5 == 0:
            acc.save_state()
        if step == steps:
            break
elif kind == "files":
    import atexit
    import json
    import logging
    import pathlib
    import shutil
    import tempfile

    import numpy as np
    from safetensors.torch import load_file, save_file
    from transformers import BertConfig, BertModel

    bert = BertModel(BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32, vocab_size=50))
    def summary() -> None:  # at the interpreter's exit, after the loop (and after a round)
        with open(os.path.join(folder, "summary.txt"), "w") as f:
            f.write(f"{steps} steps")

    atexit.register(summary)
    stale = os.path.join(folder, "stale.txt")
    if os.path.exists(stale):
        os.remove(stale)
    shutil.rmtree(os.path.join(folder, "old"), ignore_errors=True)
    os.makedirs(os.path.join(folder, "old"), exist_ok=True)
    with open(os.path.join(folder, "old", "x.txt"), "w") as f:
        f.write("new")
    log = open(os.path.join(folder, "train.log"), "a")
    events = logging.getLogger("try_records")
    events.addHandler(logging.FileHandler(os.path.join(folder, "events.log")))
    events.setLevel(logging.INFO)
    model = nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=8), 1):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        log.write(f"{step} {loss.item():.4f}\n")
        log.flush()
        events.info("step %d", step)
        if step % 5 == 0:
            w = model.weight.detach().numpy().copy()
            np.save(os.path.join(folder, "weights.npy"), w)
            assert np.array_equal(np.load(os.path.join(folder, "weights.npy")), w), "not mine"
            with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as tmp:
                json.dump({"step": step}, tmp)
            os.replace(tmp.name, os.path.join(folder, "state.json"))
            assert json.loads(pathlib.Path(folder, "state.json").read_text())["step"] == step
            pathlib.Path(folder, f"keep-{step}.txt").write_text(str(step))
            weights = os.path.join(folder, "w.safetensors")
            save_file({"w": model.weight.detach().clone()}, weights)
            assert torch.equal(load_file(weights)["w"], model.weight), "not mine"
            if step == 10:
                bert.save_pretrained(os.path.join(folder, "pretrained"))
        if step == steps:
            break
    log.close()
    with open(stale, "w") as f:
        f.write(f"{steps} steps")
print("done")
