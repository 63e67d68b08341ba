"""Batches that a DataLoader's workers repeat over an IterableDataset: the evidence that each
worker yields the whole stream.

With num_workers=N torch takes the batches from the workers in turn (batch i from worker i mod
N). Over an iterable dataset that does not split its stream between them, every worker yields
the same batches, so they come N times each, one after another: the epoch is N times the data.
What a dataset's code says (capture/iterable_split) can be wrong both ways; this is what its
batches show. So the first CHECKED_ROUNDS x N batches of a loader's first iterator with workers
are digested (each tensor's shape, dtype and bytes, and the batch's other values) and the ones
equal to a batch before them are counted (DataLoaderInfo.repeated_batches of checked_batches).
Random samples drawn in the workers, or random augmentations, differ between workers (torch
seeds each apart) and are not counted: only an exact repeat is evidence. Hashing costs about a
millisecond per MiB, for a few batches of each such loader.
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any

import numpy as np
import torch

from trainprof.runmeta import DataLoaderInfo

CHECKED_ROUNDS = 2  # rounds of one batch from each worker
MAX_WATCHED = 8  # iterators followed at once
MAX_VALUES = 64  # a batch's values digested (tensors and others), as capture/probes describes it
MAX_TENSOR_BYTES = 1 << 24  # a larger tensor: its first 16 MiB


def digest(batch: Any) -> bytes:
    """A digest of a batch's values: tensors (CPU, dense) and arrays by shape, dtype and bytes,
    numbers and strings by their repr, in tuples, lists and dicts walked in order; TypeError for
    anything else (a batch that cannot be told from another)."""
    h = hashlib.blake2b(digest_size=16)
    todo = [batch]
    seen = 0
    while todo and seen < MAX_VALUES:
        x = todo.pop()
        seen += 1
        if isinstance(x, torch.Tensor):
            if x.device.type != "cpu" or x.layout != torch.strided:
                raise TypeError("a tensor whose bytes are not read here")
            h.update(repr((tuple(x.shape), str(x.dtype))).encode())
            flat = x.detach().reshape(-1).contiguous().view(torch.uint8)
            h.update(flat[:MAX_TENSOR_BYTES].numpy().tobytes())
        elif isinstance(x, np.ndarray):
            h.update(repr((x.shape, str(x.dtype))).encode())
            h.update(np.ascontiguousarray(x).reshape(-1).view(np.uint8)[:MAX_TENSOR_BYTES].tobytes())
        elif isinstance(x, (tuple, list)):
            h.update(b"[" if isinstance(x, list) else b"(")
            todo.extend(reversed(x))
        elif isinstance(x, dict):
            h.update(b"{")
            for k in reversed(list(x)):
                todo.append(x[k])
                todo.append(k)
        elif x is None or isinstance(x, (bool, int, float, complex, str, bytes, np.generic)):
            h.update(repr(x).encode())
        else:  # its repr may hold an address, which a later object can reuse
            raise TypeError(f"a {type(x).__name__} in the batch")
    return h.digest()


class RepeatWatch:
    """The first iterator with workers of each loader over an iterable dataset, followed for
    CHECKED_ROUNDS batches per worker (`seen`, called with every batch the loop fetches)."""

    def __init__(self) -> None:
        # iterator -> (its loader's entry, the digests so far, how many to take)
        self._iters: weakref.WeakKeyDictionary[Any, tuple[DataLoaderInfo, list[bytes], int]] = (
            weakref.WeakKeyDictionary()
        )

    def watch(self, it: Any, info: DataLoaderInfo, workers: int) -> None:
        if workers < 2 or info.checked_batches or len(self._iters) >= MAX_WATCHED:
            return
        if any(entry is info for entry, _, _ in self._iters.values()):
            return  # that loader's earlier iterator is being followed
        try:
            self._iters[it] = (info, [], CHECKED_ROUNDS * workers)
        except TypeError:  # an iterator without weak references: not followed
            pass

    def seen(self, it: Any, batch: Any) -> None:
        if not self._iters:
            return
        try:
            entry = self._iters.get(it)
        except TypeError:
            return
        if entry is None:
            return
        info, digests, want = entry
        try:
            digests.append(digest(batch))
        except Exception:  # noqa: BLE001 - a batch this cannot read: the loader is not judged
            del self._iters[it]
            return
        if len(digests) >= want:
            del self._iters[it]
            info.checked_batches = len(digests)
            info.repeated_batches = sum(d in digests[:i] for i, d in enumerate(digests))
