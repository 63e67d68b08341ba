"""iterable-duplicates: a DataLoader's workers each yield the whole IterableDataset.

Why it costs: each worker of a DataLoader over an `IterableDataset` runs the dataset's whole
`__iter__` on its own copy. Unless the code splits the stream between them (asks
`torch.utils.data.get_worker_info()` which worker it is, as torch's documentation shows), every
worker yields every sample: with `num_workers=N` an epoch is N times the data, each sample
trained on N times in a row, N times the steps (and GPU time) for one pass over the data. No
error, no warning: the steps are no slower, there are only more of them.

Detection: the batches themselves (capture/repeats). torch takes batches from the workers in
turn, so a stream every worker yields whole comes N times each, one after another. The first 2N
batches of each such loader's first iterator are digested (tensors' bytes, other values' repr),
and the finding needs at least N - 1 of them to repeat one before them: random samples drawn in
the workers, or random augmentations, differ between workers (torch seeds each apart) and never
count. The dataset's code (capture/iterable_split) is named in the evidence: whether it asks
`get_worker_info()` at all.

Saving estimate: none per step, severity high. What goes is whole steps, not time in each: a
script that trains for E epochs runs E x N passes' worth of steps where E would do, (N - 1) / N
of its training; one that trains for a fixed number of steps sees each sample N times as often
and 1 / N of its data.
"""

from __future__ import annotations

from trainprof.analysis.context import Context
from trainprof.analysis.model import Finding
from trainprof.rules import INPUT, Rule
from trainprof.rules._util import finding
from trainprof.runmeta import DataLoaderInfo

FIX = (
    "Split the stream between workers in the dataset's __iter__: `info = "
    "torch.utils.data.get_worker_info()`, then keep the samples (or files, shards) i with "
    "i % info.num_workers == info.id (info is None without workers: keep all)."
)


def repeating(d: DataLoaderInfo) -> bool:
    """Whether the loader's first batches repeat as every worker yielding the whole stream does:
    at least N - 1 of the first 2N copies of an earlier one."""
    n = d.num_workers
    return (d.iterable and n >= 2 and d.checked_batches >= n
            and d.repeated_batches >= n - 1)


def check(ctx: Context) -> list[Finding]:
    if ctx.meta is None:
        return []
    out = []
    for d in ctx.meta.dataloaders:
        if not repeating(d):
            continue
        n = d.num_workers
        name = d.dataset or "the dataset"
        code = (
            "Its code never asks torch.utils.data.get_worker_info() which worker runs it."
            if not d.worker_split else
            f"Its code does ask ({d.worker_split}), but these batches show no split."
        )
        evidence = (
            f"Of the first {d.checked_batches} batches from {name} with num_workers={n}, "
            f"{d.repeated_batches} were exact copies of one before them: torch takes a batch "
            f"from each worker in turn, and each worker yields the whole IterableDataset. "
            f"{code} An epoch over it is {n}x the data: each sample is trained on {n} times, "
            f"and a run of E epochs takes the steps of {n}E. The steps are no slower, so no "
            "saving per step is claimed: what goes is steps."
        )
        out.append(
            finding(
                ctx,
                rule="iterable-duplicates",
                title=f"Each of the DataLoader's {n} workers yields the whole {name}: every "
                f"sample {n} times",
                severity="high",
                evidence=evidence,
                fix=FIX,
                saving_us_per_step=0.0,
                location=d.location,
                metrics={"num_workers": n, "checked_batches": d.checked_batches,
                         "repeated_batches": d.repeated_batches},
            )
        )
    return out


RULE = Rule(
    id="iterable-duplicates",
    detects="DataLoader workers that each yield the whole IterableDataset (every sample "
    "num_workers times).",
    fix="Split the stream in __iter__ by torch.utils.data.get_worker_info().",
    check=check,
    part=INPUT,
    removes_idle=False,  # fewer steps
)
