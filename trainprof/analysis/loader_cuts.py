"""DataLoaders whose iterators the script leaves before their end, for `dataloader-starvation`'s
model: with workers, each such iterator leaves the batches its workers fetched ahead unused.

A DataLoader with workers keeps prefetch_factor batches per worker requested ahead of the loop.
Where the script stops taking batches before the iterator's end (Lightning's
`limit_val_batches`, a `break` out of an evaluation loop), those requests are still fetched: a
persistent worker goes on until a new iterator drains them, and a non-persistent one until the
iterator is freed, usually when the next pass replaces it. That CPU time is taken from the
training steps that follow. Lightning's example (its evaluation loader of 16 batches cut at 8
every 20 steps, prefetch_factor 4, one thread): the median training step 12.9-15.3 ms with one
worker and 17.0-19.7 with two, against 11.5-12.5 and 12.1-13.3 where the passes took all 16
batches (runs a minute apart, each 240 steps); `trainprof try` measured two workers 13 points
below one in two benchmarks where the model gave both the same step.

The capture records when each iterator was made, how many batches each replaced one still had,
and how many were made with autograd off (runmeta.DataLoaderInfo); `cuts` turns that into
iterators cut per training step.

The fix gives an evaluation loader cut that way prefetch_factor=1 (EVAL_PREFETCH): each worker
then has one batch requested when the loop stops taking them. Lightning's example, six
alternated runs of each (the training loader's prefetch_factor 4): the median training step
with one worker 8.8 ms against 10.4 with the evaluation loader at 4, with two 10.5 against
10.8, the workers' CPU 1.05-1.12 cores against 1.21-1.26. (The first runs above, two of each,
saw larger differences than these, on a machine whose speed moved between them.)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainprof.runmeta import DataLoaderInfo

# The prefetch_factor the fix gives an evaluation loader that the script leaves before its end
# (the training loader keeps the suggestion's: a smaller one there lets the loop wait).
EVAL_PREFETCH = 1


@dataclass(frozen=True)
class Cut:
    """A loader whose iterators end early: `per_step` of them per training step, each with
    `left` batches it never yielded (the median; -1: its length is not known). `evaluation`:
    the fix gives it EVAL_PREFETCH (`evaluation_loader`)."""

    per_step: float
    left: int
    location: str | None = None
    evaluation: bool = False


def evaluation_loader(d: DataLoaderInfo, loaders: Sequence[DataLoaderInfo]) -> bool:
    """Whether `d` feeds evaluations, that a fix can tell apart by where it is built: most of
    its iterators were made with autograd off, and so were those of every loader built at the
    same place (HF Trainer builds all of its loaders in one library call: one user location)."""
    def grad_off(x: DataLoaderInfo) -> bool:
        return 2 * x.grad_off_iters > x.iterators

    return d.location is not None and all(
        grad_off(x) for x in loaders if x.location == d.location)


def training_loaders(loaders: Sequence[DataLoaderInfo]) -> list[DataLoaderInfo]:
    """The loaders that feed the training steps: all but the evaluation loaders
    (`evaluation_loader`), or every loader where none is told apart."""
    return [d for d in loaders if not evaluation_loader(d, loaders)] or list(loaders)


def training_workers(loaders: Sequence[DataLoaderInfo]) -> int:
    """The most workers a loader that feeds the training steps has: an evaluation loader's
    workers neither feed the steps nor say what the training loader's workers do. 0 without
    loaders."""
    return max((d.num_workers for d in training_loaders(loaders)), default=0)


def cuts(loaders: Sequence[DataLoaderInfo]) -> list[Cut]:
    """The loaders cut short more than once apart in the training steps: the iterators left
    before their end over the steps between the first iterator made and the last (a pass
    every E steps: 1 / E). Iterators all made in one step (passes after training) count none."""
    out = []
    for d in loaders:
        span = d.iter_steps[-1] - d.iter_steps[0] if d.iter_steps else 0
        events = min(len(d.left_early), len(d.iter_steps) - 1)
        if span > 0 and events > 0:
            left = int(np.median(d.left_early)) if min(d.left_early) >= 0 else -1
            out.append(Cut(events / span, left, d.location, evaluation_loader(d, loaders)))
    return out


def evaluation_locations(found: Sequence[Cut]) -> list[str]:
    """Where the cut evaluation loaders are built (file:line), those the fix gives
    EVAL_PREFETCH."""
    return sorted({c.location for c in found if c.evaluation and c.location})


def place_names(locations: Iterable[str], sep: str = ", ") -> str:
    """file:line places by their file's name (a fix's text names the loaders so)."""
    return sep.join(os.path.basename(str(p)) for p in locations)


def evaluation_fix(workers: int, locations: Iterable[str]) -> str:
    """The fix for the evaluation loaders built at `locations`: EVAL_PREFETCH batches a worker.
    It names the workers too: DataLoader refuses a prefetch_factor without them."""
    return (f"DataLoader(..., num_workers={workers}, persistent_workers=True, prefetch_factor="
            f"{EVAL_PREFETCH}) for the evaluation loader built at {place_names(locations)}")


def wasted_batches(found: Sequence[Cut], workers: int, prefetch: int) -> float:
    """Batches per training step that `workers` workers fetch for iterators the script then
    leaves: what each cut had requested ahead (`prefetch` batches per worker, EVAL_PREFETCH for
    an evaluation loader), at most what it had left."""
    total = 0.0
    for c in found:
        ahead = (EVAL_PREFETCH if c.evaluation else prefetch) * workers
        total += c.per_step * (ahead if c.left < 0 else min(ahead, c.left))
    return total


def to_metrics(found: Sequence[Cut]) -> dict[str, list[float] | list[int] | list[str]]:
    """The cuts as a finding's metrics (`from_metrics` reads them back); none without cuts."""
    if not found:
        return {}
    return {"cut_iterators_per_step": [round(c.per_step, 5) for c in found],
            "cut_batches_left": [c.left for c in found],
            "cut_evaluation": [int(c.evaluation) for c in found],
            "cut_locations": [c.location or "" for c in found]}


def from_metrics(metrics: Mapping[str, Any]) -> list[Cut]:
    rates, left = metrics.get("cut_iterators_per_step"), metrics.get("cut_batches_left")
    if not isinstance(rates, list) or not isinstance(left, list) or len(rates) != len(left):
        return []
    evals = metrics.get("cut_evaluation")
    where = metrics.get("cut_locations")
    evals = evals if isinstance(evals, list) and len(evals) == len(rates) else [0] * len(rates)
    where = where if isinstance(where, list) and len(where) == len(rates) else [""] * len(rates)
    return [Cut(float(r), int(n), str(p) or None, bool(e))
            for r, n, e, p in zip(rates, left, evals, where, strict=True)]
