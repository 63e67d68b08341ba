"""capture/iterable_split: whether an IterableDataset's code splits its stream between
DataLoader workers, read from the code of real datasets in modules of their own (a module's
functions count for the classes in it), then checked against what the workers really yield."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from trainprof.capture import iterable_split

DATASETS = {
    # The documentation's first example: each worker yields all of range(start, end).
    "plain": """
        from torch.utils.data import IterableDataset

        class Numbers(IterableDataset):
            def __iter__(self):
                return iter(range(8))
    """,
    # Split in __iter__, as torch's documentation shows.
    "in_iter": """
        import torch
        from torch.utils.data import IterableDataset

        class Numbers(IterableDataset):
            def __iter__(self):
                info = torch.utils.data.get_worker_info()
                n, i = (1, 0) if info is None else (info.num_workers, info.id)
                return iter(range(i, 8, n))
    """,
    # Split by a helper function of the module, imported name and all.
    "helper": """
        from torch.utils.data import IterableDataset, get_worker_info

        def mine(items):
            info = get_worker_info()
            n, i = (1, 0) if info is None else (info.num_workers, info.id)
            return (x for k, x in enumerate(items) if k % n == i)

        class Numbers(IterableDataset):
            def __iter__(self):
                return mine(range(8))
    """,
    # A wrapper of its own around a dataset (another module's) that splits.
    "wrapper": """
        from torch.utils.data import IterableDataset

        class Doubled(IterableDataset):
            def __init__(self, inner):
                self.inner = inner

            def __iter__(self):
                return (2 * x for x in self.inner)
    """,
    # Pipeline stages held in a list: one stage splits (webdataset's style).
    "stages": """
        from torch.utils.data import IterableDataset

        class Pipeline(IterableDataset):
            def __init__(self, *stages):
                self.stages = list(stages)

            def __iter__(self):
                items = iter(range(8))
                for stage in self.stages:
                    items = stage(items)
                return items
    """,
}


def _module(tmp_path: Path, name: str):
    path = tmp_path / f"ds_{name}.py"
    path.write_text(textwrap.dedent(DATASETS[name]))
    spec = importlib.util.spec_from_file_location(f"ds_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _yielded(loader: DataLoader) -> list[int]:
    return sorted(int(x) for x in loader)


@pytest.mark.parametrize(
    ("name", "split"),
    [("plain", ""), ("in_iter", iterable_split.GET_WORKER_INFO),
     ("helper", iterable_split.GET_WORKER_INFO)],
)
def test_what_the_code_says_is_what_two_workers_yield(tmp_path: Path, name: str, split: str):
    dataset = _module(tmp_path, name).Numbers()
    assert iterable_split.worker_split(DataLoader(dataset, batch_size=None)) == split
    # Checked against the workers themselves: unsplit, each yields every sample.
    got = _yielded(DataLoader(dataset, batch_size=None, num_workers=2))
    assert got == (sorted(2 * list(range(8))) if not split else list(range(8)))


def test_a_wrapper_and_pipeline_stages_count_what_they_hold(tmp_path: Path):
    inner = _module(tmp_path, "in_iter").Numbers()
    doubled = _module(tmp_path, "wrapper").Doubled
    assert iterable_split.worker_split(DataLoader(doubled(inner), batch_size=None)) == (
        iterable_split.GET_WORKER_INFO)
    plain = _module(tmp_path, "plain").Numbers()
    assert iterable_split.worker_split(DataLoader(doubled(plain), batch_size=None)) == ""
    helper = _module(tmp_path, "helper")
    pipeline = _module(tmp_path, "stages").Pipeline
    assert iterable_split.worker_split(DataLoader(pipeline(helper.mine), batch_size=None)) == (
        iterable_split.GET_WORKER_INFO)
    assert iterable_split.worker_split(DataLoader(pipeline(sorted), batch_size=None)) == ""


def test_a_worker_init_fn_is_taken_to_split_it(tmp_path: Path):
    dataset = _module(tmp_path, "plain").Numbers()
    loader = DataLoader(dataset, batch_size=None, worker_init_fn=lambda worker: None)
    assert iterable_split.worker_split(loader) == iterable_split.WORKER_INIT_FN


def test_no_shards_outside_hugging_face_datasets(tmp_path: Path):
    numbers = _module(tmp_path, "plain").Numbers()
    numbers.num_shards = 4  # an attribute of the same name means nothing here
    assert iterable_split.num_shards(numbers) is None
