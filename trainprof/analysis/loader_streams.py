"""The training loaders over iterable datasets, and what they mean for workers.

Each DataLoader worker runs an IterableDataset's whole `__iter__`: a dataset that does not
split its stream between them (capture/iterable_split reads its code) yields every sample once
per worker, and one that splits it by shards gives no shard to workers past their count. One
worker is safe either way: it yields the stream once.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainprof.analysis import loader_cuts
from trainprof.runmeta import DataLoaderInfo


def unsplit(loaders: Sequence[DataLoaderInfo]) -> list[DataLoaderInfo]:
    """The training loaders over an iterable dataset not seen to split its stream."""
    return [d for d in loader_cuts.training_loaders(loaders) if d.iterable and not d.worker_split]


def shard_cap(loaders: Sequence[DataLoaderInfo]) -> int | None:
    """The most workers that get any of a training loader's stream: the fewest shards of a
    dataset that splits by shards (None: no such cap)."""
    caps = [d.num_shards for d in loader_cuts.training_loaders(loaders)
            if d.iterable and d.num_shards]
    return min(caps) if caps else None


def dataset_names(found: Sequence[DataLoaderInfo]) -> str:
    """The loaders' datasets by class name, each once."""
    return ", ".join(sorted({d.dataset or "the dataset" for d in found}))


def unsplit_fix(found: Sequence[DataLoaderInfo], workers: int) -> str:
    """The fix's caveat for `workers` workers over datasets that do not split their stream."""
    names = dataset_names(found)
    return (
        f"\nFirst split the stream: {names} is an IterableDataset whose code never asks "
        f"torch.utils.data.get_worker_info(), so each of the {workers} workers would run all of "
        f"it, and a stream read from data (files, a list) would yield every sample {workers} "
        "times. In its __iter__, `info = get_worker_info()` and keep the samples (or files) i "
        "with i % info.num_workers == info.id."
    )


def shard_note(cap: int) -> str:
    """Why the workers suggested stop at the dataset's shards."""
    return (f" The dataset splits its stream by shards and has {cap}: workers beyond {cap} get "
            "none (`datasets` stops them), so the count stops there.")


def reshard_fix(shards: int) -> str:
    """The fix where a dataset's few shards leave workers nothing to gain."""
    some = f"{shards} shards" if shards > 1 else "one shard"
    return (f"More shards first: the dataset gives each worker whole shards (files), and with "
            f"{some} workers fetch no faster than the loop. Split the data into as many "
            "files as the workers you want (Hugging Face `datasets` can `reshard()` some "
            "formats), then DataLoader(..., num_workers=N, persistent_workers=True).")
