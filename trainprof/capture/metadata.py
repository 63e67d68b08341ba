"""Run metadata: what the script built (DataLoaders, optimizers, metrics), the flags it set, and
the environment, collected into `RunMeta` (trainprof.json).

Constructors are wrapped to learn *where* in user code each object was built; backend flags are
read at the end of the run because scripts set them as they go.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import msgspec
import torch
from torch.utils.data import IterableDataset

import trainprof
from trainprof.capture import iterable_split
from trainprof.capture.compat import is_compiling
from trainprof.capture.dynamo import DynamoWatch
from trainprof.capture.loadprobe import LoadProbe, cpu_model, cpu_quota, usable_cpus
from trainprof.capture.patching import Patches
from trainprof.capture.repeats import RepeatWatch
from trainprof.capture.state import S
from trainprof.capture.userframe import UserCode
from trainprof.capture.workerbatches import WorkerBatches
from trainprof.runmeta import (
    LAUNCHER_ENV,
    MAX_ITERS_KEPT,
    MAX_WORKER_BATCHES,
    DataLoaderInfo,
    DynamoInfo,
    Flags,
    MetricInfo,
    OptimizerInfo,
    started_by_torchrun,
)


def _qualname(obj: Any) -> str:
    return type(obj).__qualname__


def _opt_bool(value: Any) -> bool | None:
    return None if value is None else bool(value)


def batches_left(it: Any) -> int | None:
    """The batches a DataLoader iterator had not yet yielded: 0 at its end, -1 where its length
    is not known (an iterable dataset that did not end), None where it cannot be told (a
    sampler without a length)."""
    fetcher = getattr(it, "_dataset_fetcher", None)
    if getattr(fetcher, "ended", None) is not None:  # an iterable dataset, in this process
        return 0 if fetcher.ended else -1
    yielded = getattr(it, "_num_yielded", None)
    try:
        total = len(it)
    except TypeError:
        return None
    return None if yielded is None else max(total - int(yielded), 0)


class MetaCollector:
    def __init__(self, patches: Patches, user: UserCode) -> None:
        self.patches = patches
        self.user = user
        self.dataloaders: list[DataLoaderInfo] = []
        # DataLoader object -> its entry (weak: a loader rebuilt every epoch must not be kept)
        self._loader_info: weakref.WeakKeyDictionary[Any, DataLoaderInfo] = (
            weakref.WeakKeyDictionary()
        )
        # id of a DataLoaderInfo -> the latest iterator over its loaders (a loader rebuilt per
        # pass is one entry): how far it got is read when the next is made. Held for a
        # map-style loader without workers, whose iterator the script may drop when it breaks
        # out of its loop; only weakly with workers, whose iterator shuts them down when freed,
        # and over an iterable dataset, whose own iterator may hold a file or a connection that
        # freeing it closes.
        self._last_iter: dict[int, Any] = {}
        self._step_of: Callable[[], int] = lambda: 0
        self.optimizers: list[OptimizerInfo] = []
        self._metrics: list[tuple[MetricInfo, weakref.ref[Any]]] = []
        self.autocast_used = False
        self.grad_scaler_used = False
        self.compile_used = False
        self.dynamo = DynamoWatch(patches, user)
        # the first batches of iterable datasets' loaders with workers (the fetch probe's)
        self.repeats = RepeatWatch()
        # the script's workers' batches, timed in them, per dataset (the loaders' infos by the
        # id of their dataset, as the workers report it)
        self.worker_batches = WorkerBatches()
        self._by_dataset: dict[int, DataLoaderInfo] = {}

    # ----- constructors ----------------------------------------------------------------------
    def install(self) -> None:
        from torch.amp.autocast_mode import autocast
        from torch.utils.data import DataLoader

        self.patches.wrap(DataLoader, "__init__", lambda orig: self._after_init(orig, self._loader))
        self.patches.wrap(DataLoader, "__iter__", self._wrap_loader_iter)
        # The iterators held end with the capture: the script's dataset is let go after it.
        self.patches.on_restore(self._last_iter.clear)
        self.patches.wrap(
            torch.optim.Optimizer, "__init__", lambda orig: self._after_init(orig, self._optimizer)
        )
        self.patches.wrap(autocast, "__enter__", self._wrap_autocast)
        scaler = getattr(torch.amp, "GradScaler", None)
        if scaler is not None:
            self.patches.wrap(scaler, "__init__", self._wrap_scaler)
        self.patches.wrap(torch, "compile", self._wrap_compile)
        self.worker_batches.install(self.patches)

    def _after_init(
        self, orig: Callable[..., None], record: Callable[[Any, str | None], None]
    ) -> Callable[..., None]:
        user = self.user

        @functools.wraps(orig)
        def __init__(obj: Any, *args: Any, **kwargs: Any) -> None:
            orig(obj, *args, **kwargs)
            if S.enabled:
                try:
                    record(obj, user.caller())
                except Exception:  # metadata is best effort; the script must not notice
                    pass

        return __init__

    def _loader(self, loader: Any, where: str | None) -> None:
        if loader in self._loader_info:  # a subclass whose __init__ ran the base one again
            return
        info = DataLoaderInfo(
            num_workers=int(loader.num_workers),
            pin_memory=bool(loader.pin_memory),
            batch_size=loader.batch_size,
            persistent_workers=bool(loader.persistent_workers),
            prefetch_factor=getattr(loader, "prefetch_factor", None),
            dataset=_qualname(loader.dataset),
            location=where,
        )
        if isinstance(loader.dataset, IterableDataset):
            info.iterable = True
            info.worker_split = iterable_split.worker_split(loader)
            info.num_shards = iterable_split.num_shards(loader.dataset)
        for seen in self.dataloaders:  # the same call, same settings: a loader built per epoch
            if msgspec.structs.replace(
                info, instances=seen.instances, iterators=seen.iterators,
                iter_steps=seen.iter_steps, left_early=seen.left_early,
                grad_off_iters=seen.grad_off_iters, checked_batches=seen.checked_batches,
                repeated_batches=seen.repeated_batches, worker_batch_ms=seen.worker_batch_ms,
            ) == seen:
                seen.instances += 1
                info = seen
                break
        else:
            self.dataloaders.append(info)
        self._loader_info[loader] = info
        if info.num_workers > 0:
            self._by_dataset[id(loader.dataset)] = info

    def timed_worker_batches(self) -> None:
        """Each loader with workers gets its workers' batch times so far (ms, the first
        MAX_WORKER_BATCHES kept; capture/workerbatches)."""
        for ds, times in self.worker_batches.times().items():
            info = self._by_dataset.get(ds)
            if info is not None:
                info.worker_batch_ms = [round(1000 * t, 3) for t in times[:MAX_WORKER_BATCHES]]

    def _wrap_loader_iter(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def __iter__(loader: Any) -> Any:
            follow = False
            if S.enabled:
                try:
                    info = self._loader_info.get(loader)
                except TypeError:  # an unhashable subclass: not counted
                    info = None
                if info is not None:
                    info.iterators += 1
                    try:
                        self._iterating(info)
                        follow = True
                    except Exception:  # metadata is best effort; the script must not notice
                        pass
            it = orig(loader)
            if follow and info.iterable:
                try:
                    self.repeats.watch(it, info, int(loader.num_workers))
                except Exception:  # metadata is best effort; the script must not notice
                    pass
            if follow:
                try:
                    iterable = isinstance(loader.dataset, IterableDataset)
                    hold = loader.num_workers == 0 and not iterable
                    self._last_iter[id(info)] = it if hold else weakref.ref(it)
                except TypeError:  # an iterator without weak references: not followed
                    self._last_iter.pop(id(info), None)
            return it

        return __iter__

    def _iterating(self, info: DataLoaderInfo) -> None:
        """A new iterator over a loader of `info`: when it starts, and how far the one before it
        got."""
        if len(info.iter_steps) < MAX_ITERS_KEPT:
            info.iter_steps.append(int(self._step_of() or 0))
        if not torch.is_grad_enabled():  # inference_mode too
            info.grad_off_iters += 1
        prev = self._last_iter.get(id(info))
        if isinstance(prev, weakref.ref):
            prev = prev()
        left = None if prev is None else batches_left(prev)
        if left and len(info.left_early) < MAX_ITERS_KEPT:
            info.left_early.append(left)
        self._last_iter[id(info)] = None

    def _optimizer(self, opt: Any, where: str | None) -> None:
        group = opt.param_groups[0] if opt.param_groups else {}
        defaults = getattr(opt, "defaults", {}) or {}
        self.optimizers.append(
            OptimizerInfo(
                cls=_qualname(opt),
                foreach=_opt_bool(group.get("foreach", defaults.get("foreach"))),
                fused=_opt_bool(group.get("fused", defaults.get("fused"))),
                location=where,
            )
        )

    def _wrap_autocast(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def __enter__(ctx: Any) -> Any:
            if not is_compiling() and S.enabled and getattr(ctx, "_enabled", True):
                self.autocast_used = True
            return orig(ctx)

        return __enter__

    def _wrap_scaler(self, orig: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(orig)
        def __init__(scaler: Any, *args: Any, **kwargs: Any) -> None:
            orig(scaler, *args, **kwargs)
            if S.enabled:
                self.grad_scaler_used = True

        return __init__

    def _wrap_compile(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def compile(*args: Any, **kwargs: Any) -> Any:
            if S.enabled:
                self.compile_used = True
                try:
                    self.dynamo.install()
                except Exception:  # metadata is best effort; the script must not notice
                    pass
            return orig(*args, **kwargs)

        return compile

    def watch_steps(self, step_of: Callable[[], int]) -> None:
        """`step_of()`: the number of the step in progress (compiles and DataLoader iterators
        are placed in steps)."""
        self.dynamo.step_of = step_of
        self._step_of = step_of

    # ----- torchmetrics (called by trainprof.capture.metrics) --------------------------------
    def add_metric(self, metric: Any, where: str | None) -> None:
        info = MetricInfo(cls=_qualname(metric), location=where)
        self._metrics.append((info, weakref.ref(metric)))

    def refresh_metric(self, metric: Any) -> None:
        for info, ref in self._metrics:
            if ref() is metric:
                _read_metric(info, metric)

    @property
    def metrics(self) -> list[MetricInfo]:
        for info, ref in self._metrics:
            metric = ref()
            if metric is not None:
                _read_metric(info, metric)
        return [info for info, _ in self._metrics]

    # ----- end of run --------------------------------------------------------------------------
    def dynamo_info(self) -> DynamoInfo | None:
        return self.dynamo.result()

    def flags(self) -> Flags:
        """Backend flags as the script left them, plus what it used."""
        flags = Flags(
            autocast_used=self.autocast_used,
            grad_scaler_used=self.grad_scaler_used,
            compile_used=self.compile_used,
        )
        readers: dict[str, Callable[[], Any]] = {
            "cudnn_benchmark": lambda: bool(torch.backends.cudnn.benchmark),
            "cuda_matmul_allow_tf32": lambda: bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": lambda: bool(torch.backends.cudnn.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision,
        }
        with warnings.catch_warnings():  # newer torch deprecates the allow_tf32 getters
            warnings.simplefilter("ignore")
            for name, read in readers.items():
                try:
                    setattr(flags, name, read())
                except Exception:
                    pass
        return flags


def _read_metric(info: MetricInfo, metric: Any) -> None:
    try:
        strategy = getattr(metric, "nan_strategy", None)
        info.nan_strategy = None if strategy is None else str(strategy)
        info.device = str(metric.device)
    except Exception:
        pass


# Environment variables that change how a training run runs, kept for `trainprof try`.
_ENV_PREFIXES = (
    "CUDA_", "NVIDIA_", "PYTORCH_", "TORCH", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "GOMP_",
    "NCCL_", "GLOO_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "ACCELERATE_", "PL_", "LIGHTNING_",
    "MALLOC_", "XLA_", "PYTHON", "LD_PRELOAD", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "WANDB_MODE",
)
_SECRET = ("TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL", "AUTH")


def relaunch_context() -> dict[str, Any]:
    """The working folder, the interpreter and the relevant environment, as the script starts."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k.startswith(_ENV_PREFIXES) and not any(s in k.upper() for s in _SECRET)
        and not k.startswith(LAUNCHER_ENV)
    }
    return {"cwd": os.getcwd(), "executable": sys.executable, "env": env,
            "torchrun": started_by_torchrun(os.environ)}


def environment(load: LoadProbe | None = None, init_cuda: bool = True) -> dict[str, Any]:
    """Versions, devices, CPUs and, with the probe started with the script, the machine's load
    over the run; read at the end of the run (device names initialise CUDA, which must not
    happen before the script forks its DataLoader workers). `init_cuda=False` (metadata written
    while the script runs): GPU names only if the script initialised CUDA."""
    devices: list[str] = []
    try:
        if not init_cuda and not torch.cuda.is_initialized():
            pass
        elif torch.cuda.is_available():
            devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            devices = ["mps"]
    except Exception:
        pass
    quota = cpu_quota()
    return {
        "trainprof_version": trainprof.__version__,
        "torch_version": str(torch.__version__),  # TorchVersion is a str subclass msgspec rejects
        "cuda_version": None if torch.version.cuda is None else str(torch.version.cuda),
        "python_version": platform.python_version(),
        "devices": devices,
        "cpu_count": usable_cpus(quota),
        "cpu_quota": quota,
        "cpus_online": os.cpu_count(),
        "cpu_model": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "load": None if load is None else load.finish(),
    }


def distributed() -> tuple[int | None, int | None]:
    """(rank, world size) when the script ran under torch.distributed / torchrun."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is not None and world is not None and rank.isdigit() and world.isdigit():
        return int(rank), int(world)
    return None, None


LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def local_world_size(world: int) -> int | None:
    """The job's ranks on this machine (a job of `world` ranks): where the launcher says so
    (torchrun and accelerate set LOCAL_WORLD_SIZE), else every rank where the job's rendezvous
    is on this machine's loopback address (MASTER_ADDR: Lightning's ddp and
    torch.multiprocessing.spawn jobs on one machine, which say no more); None otherwise."""
    n = os.environ.get("LOCAL_WORLD_SIZE", "")
    if n.isdigit() and int(n) > 0:
        return int(n)
    return world if os.environ.get("MASTER_ADDR") in LOCAL_HOSTS else None


def live_rank() -> tuple[int, int] | None:
    """(rank, world size) while torch.distributed is initialized with more than one rank."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    return None
