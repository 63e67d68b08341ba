"""Metric syncs: TorchMetrics and loss logging that block the host on the GPU every step.

A ResNet-18 on FakeData tracks a MeanMetric of the loss plus a MetricCollection (accuracy,
precision, recall, F1) that is updated every step and computed every ``--compute-every`` steps.
The broken form makes the host wait for the GPU several times per step: ``loss.item()`` and the
copies of predictions and targets to CPU-resident metrics. Just moving the metrics to the GPU
would trade those copies for other syncs: the MeanMetric's NaN check (``if nans.any()``) and the
classification metrics' argument validation (``torch.unique`` + ``len``). The fix removes all of
them. On a CPU run there is no GPU to wait for, so the step time barely changes; a profiler
still shows where a GPU would stall.

    python examples/metrics_sync.py            # broken
    python examples/metrics_sync.py --fixed    # metrics on device, no per-step syncs
"""

from __future__ import annotations

import argparse

import torch
import torchvision
from _timing import StepClock  # examples/_timing.py: step timing without device syncs
from torch import nn
from torch.utils.data import DataLoader
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import Accuracy, F1Score, Precision, Recall
from torchvision.transforms import v2

BATCH_SIZE = 16
NUM_CLASSES = 10



def make_metrics(validate_args: bool) -> MetricCollection:
    kw = {"task": "multiclass", "num_classes": NUM_CLASSES, "validate_args": validate_args}
    macro = {**kw, "average": "macro"}  # per-class scores averaged: more telling than micro
    # One collection: precision, recall and F1 share a compute group (one stat-scores update).
    return MetricCollection(
        {
            "acc": Accuracy(**kw),
            "precision": Precision(**macro),
            "recall": Recall(**macro),
            "f1": F1Score(**macro),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120, help="training steps to run")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--fixed", action="store_true", help="apply the recommended fix")
    parser.add_argument("--compute-every", type=int, default=20, help="metric compute interval")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)

    # Cheap synthetic data (not the bottleneck here): random 64x64 images, 10 classes.
    dataset = torchvision.datasets.FakeData(
        size=args.steps * BATCH_SIZE,
        image_size=(3, 64, 64),
        num_classes=NUM_CLASSES,
        transform=v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]),
    )
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True, drop_last=True)

    model = torchvision.models.resnet18(num_classes=NUM_CLASSES).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    if args.fixed:
        # FIX: nan_strategy="disable" (torchmetrics >= 1.7) skips the `if nans.any()` check.
        # (torchmetrics <= 1.9 then ignores `weight=`, issue #3434: we feed per-sample losses.)
        loss_metric = MeanMetric(nan_strategy="disable").to(device)
        # FIX: metric states live on the data's device, and validate_args=False drops the
        # per-update torch.unique() + len() check (a sync) on inputs we know are well formed.
        metrics = make_metrics(validate_args=False).to(device)
        criterion = nn.CrossEntropyLoss(reduction="none")  # per-sample losses for the MeanMetric
    else:
        # PROBLEM: the default nan_strategy="warn" runs `if nans.any()` at every update: a host
        # sync per step as soon as the metric lives on the GPU.
        loss_metric = MeanMetric()
        # PROBLEM: states stay on the CPU (no .to(device)), so every update copies from the GPU,
        # and validate_args=True (the default) runs torch.unique() + len() on every update: one
        # more sync per step once the metrics are moved to the GPU.
        metrics = make_metrics(validate_args=True)
        criterion = nn.CrossEntropyLoss()

    losses = []
    clock = StepClock(device, args.steps)
    for step, (images, labels) in enumerate(clock.timed(loader)):
        images, labels = images.to(device), labels.to(device)
        logits = model(images)

        if args.fixed:
            per_sample = criterion(logits, labels)
            loss = per_sample.mean()
            # FIX: tensor updates that stay on the device; nothing waits for the GPU here.
            loss_metric.update(per_sample.detach())
            metrics.update(logits.detach(), labels)
        else:
            loss = criterion(logits, labels)
            loss_value = loss.item()  # PROBLEM: waits for the forward pass, every step
            losses.append(loss_value)  # ... only to keep a Python list of losses for logging
            # PROBLEM: Python numbers: torchmetrics builds two new tensors from them per update
            # (and copies them host-to-device for a metric on the GPU).
            loss_metric.update(loss_value, weight=images.size(0))
            # PROBLEM: device-to-host copies of predictions and targets for CPU-resident metrics.
            metrics.update(logits.detach().cpu(), labels.cpu())

        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

        if (step + 1) % args.compute_every == 0:
            # compute() every N steps: one deliberate sync per N steps, fine in both forms.
            values = {name: f"{v.item():.3f}" for name, v in metrics.compute().items()}
            print(f"step {step + 1}: loss {loss_metric.compute().item():.3f} {values}")

    print(clock.summary("metrics_sync", args.fixed))


if __name__ == "__main__":
    main()
