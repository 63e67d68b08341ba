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

The capture records when each iterator was made and how many batches each replaced one still
had (runmeta.DataLoaderInfo); `cuts` turns that into iterators cut per training step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainprof.runmeta import DataLoaderInfo


@dataclass(frozen=True)
class Cut:
    """A loader whose iterators end early: `per_step` of them per training step, each with
    `left` batches it never yielded (the median; -1: its length is not known)."""

    per_step: float
    left: int
    location: str | None = None


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
            out.append(Cut(events / span, left, d.location))
    return out


def wasted_batches(found: Sequence[Cut], workers: int, prefetch: int) -> float:
    """Batches per training step that `workers` workers with `prefetch` batches each in hand
    fetch for iterators the script then leaves: what each cut had requested ahead, at most
    what it had left."""
    ahead = prefetch * workers
    return sum(c.per_step * (ahead if c.left < 0 else min(ahead, c.left)) for c in found)


def to_metrics(found: Sequence[Cut]) -> dict[str, list[float] | list[int]]:
    """The cuts as a finding's metrics (`from_metrics` reads them back); none without cuts."""
    if not found:
        return {}
    return {"cut_iterators_per_step": [round(c.per_step, 5) for c in found],
            "cut_batches_left": [c.left for c in found]}


def from_metrics(metrics: Mapping[str, Any]) -> list[Cut]:
    rates, left = metrics.get("cut_iterators_per_step"), metrics.get("cut_batches_left")
    if not isinstance(rates, list) or not isinstance(left, list) or len(rates) != len(left):
        return []
    return [Cut(float(r), int(n)) for r, n in zip(rates, left, strict=True)]
