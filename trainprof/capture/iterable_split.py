"""Whether an iterable dataset splits its stream between DataLoader workers.

Each worker of a DataLoader over an IterableDataset runs the dataset's whole `__iter__` on its
own copy. Unless that code asks `torch.utils.data.get_worker_info()` which worker it is (or a
`worker_init_fn` configures each copy, as torch's documentation shows), every sample comes
num_workers times, silently: `num_workers=2` on such a dataset doubles the epoch. So the
suggestion of workers for one must say to split it first, and `trainprof try`'s rounds, whose
workers each yield the whole stream, time the step but not the epoch.

What is read is the code, not run: the names the functions of the dataset's classes use, the
functions beside them in their modules (a helper that shards), the functions those modules
import (webdataset's `split_by_worker`), and the same for the iterable datasets and callables
the dataset holds (a wrapper, a list of pipeline stages). A torch DataPipe is split by the
DataLoader itself at its `sharding_filter`. Hugging Face's streaming datasets read
`get_worker_info()` and give each worker whole shards (files): workers beyond `num_shards` are
stopped, so the count is kept to cap the workers suggested.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterator
from typing import Any

NAME = "get_worker_info"
# Ways a dataset is seen to split its stream (DataLoaderInfo.worker_split); "" where none is
GET_WORKER_INFO = "get_worker_info"
WORKER_INIT_FN = "worker_init_fn"
DATAPIPE = "datapipe"


def _functions(value: Any) -> Iterator[types.FunctionType]:
    """The Python functions behind a class attribute or a held callable."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        yield from (f for f in (value.fget, value.fset) if isinstance(f, types.FunctionType))
        return
    if isinstance(value, types.MethodType):
        value = value.__func__
    if isinstance(value, functools.partial):
        value = value.func
    if isinstance(value, types.FunctionType):
        yield value


def _uses(code: types.CodeType) -> bool:
    """`code`, or a function or class body nested in it, names get_worker_info."""
    if NAME in code.co_names:
        return True
    return any(isinstance(c, types.CodeType) and _uses(c) for c in code.co_consts)


def _module_functions(func: types.FunctionType) -> Iterator[types.FunctionType]:
    """The functions in `func`'s module namespace: defined there or imported into it."""
    for value in list(func.__globals__.values()):
        if isinstance(value, types.FunctionType):
            yield value


def _class_functions(cls: type) -> Iterator[types.FunctionType]:
    for klass in cls.__mro__:
        if klass.__module__ in ("builtins", "typing") or klass.__module__.startswith(
            "torch.utils.data"
        ):
            continue
        for value in list(vars(klass).values()):
            yield from _functions(value)


def _held(dataset: Any) -> Iterator[Any]:
    """What the dataset holds one level down: datasets it wraps, pipeline stages."""
    try:
        values = list(vars(dataset).values())
    except TypeError:  # no __dict__
        return
    for value in values:
        if isinstance(value, (list, tuple)):
            yield from value
        else:
            yield value


def reads_worker_info(dataset: Any) -> bool:
    """Whether code of the dataset's classes, of their modules, or of what it holds (datasets
    it wraps, callables) names `get_worker_info`."""
    from torch.utils.data import Dataset

    seen: set[int] = set()
    roots = [dataset]
    for held in _held(dataset):
        if isinstance(held, Dataset) or callable(held):
            roots.append(held)
    for root in roots:
        own = list(_class_functions(type(root))) if isinstance(root, Dataset) else []
        own += list(_functions(root))
        for func in own:
            for f in [func, *_module_functions(func)]:
                if id(f) in seen:
                    continue
                seen.add(id(f))
                if _uses(f.__code__):
                    return True
    return False


def worker_split(loader: Any) -> str:
    """How the loader's iterable dataset is seen to split its stream between workers
    (GET_WORKER_INFO, WORKER_INIT_FN, DATAPIPE), or "" where nothing is seen to."""
    from torch.utils.data import IterDataPipe

    dataset = loader.dataset
    if isinstance(dataset, IterDataPipe):
        return DATAPIPE
    if reads_worker_info(dataset):
        return GET_WORKER_INFO
    if getattr(loader, "worker_init_fn", None) is not None:
        return WORKER_INIT_FN
    return ""


def num_shards(dataset: Any) -> int | None:
    """The shards a Hugging Face streaming dataset splits between workers (None: not one)."""
    module = type(dataset).__module__
    if not (module == "datasets" or module.startswith("datasets.")):
        return None
    try:
        n = dataset.num_shards
    except Exception:  # an attribute of another version, or one that needs a download
        return None
    return n if isinstance(n, int) and n > 0 else None
