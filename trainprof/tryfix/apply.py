"""The fixes, applied at runtime and reversibly (capture/patching.py) before the script starts.

Each `install_<rule>` patches torch (or TorchMetrics) so that the unmodified script runs with the
fix; `Applied` collects what was done and what could not be (a compile failure, a fix that does
not apply to this machine), for the round's result file. The fixes of catalog.SWITCHABLE rules
follow a Switch (tryfix/switch): on, as installed; off, the script's own behaviour.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainprof.analysis.loader_cuts import EVAL_PREFETCH, place_names
from trainprof.capture.bf16fix import channels_last_now, install_autocast, is_cnn
from trainprof.capture.cudacheck import cuda_available
from trainprof.capture.optprobe import fused_ok
from trainprof.capture.patching import Patches, edit_init
from trainprof.capture.userframe import UserCode
from trainprof.tryfix.catalog import PREFETCH
from trainprof.tryfix.switch import Switch


@dataclass
class Applied:
    notes: list[str] = field(default_factory=list)  # what the fixes did at runtime
    skipped: dict[str, str] = field(default_factory=dict)  # rule -> why it did not apply
    failed: dict[str, str] = field(default_factory=dict)  # rule -> error (e.g. compile)
    compile_steps: list[int] = field(default_factory=list)  # steps during which dynamo compiled
    step_of: Callable[[], int] = lambda: 0  # the current step number (set by the round)


def install(
    specs: list[dict], patches: Patches, applied: Applied, switch: Switch | None = None,
    user: UserCode | None = None,
) -> None:
    """Install every fix in `specs` ([{"rule": id, "options": {...}}]); those of
    catalog.SWITCHABLE rules follow `switch` (always on without one). `user`: which code is the
    script's, to tell where a DataLoader is built."""
    switch = switch or Switch()
    user = user or UserCode()
    root = _RootFinder(patches)
    for spec in specs:
        rule, options = spec["rule"], spec.get("options", {})
        if rule == "dataloader-starvation" and options.get("sharing_strategy"):
            _sharing_strategy(patches, applied, str(options["sharing_strategy"]))
        elif rule == "dataloader-starvation" and options.get("pin_memory"):
            _pinned(patches, applied, rule, copies=False)
        elif rule == "dataloader-starvation":
            _dataloader(patches, options, user, applied)
        elif rule == "pageable-memcpy":
            _pinned(patches, applied)
        elif rule == "zero-grad-not-none":
            _zero_grad(patches, switch)
        elif rule == "optimizer-foreach":
            _optimizer(patches, switch)
        elif rule == "cudnn-benchmark-off":
            _cudnn_benchmark(patches, applied)
        elif rule == "tf32-off":
            _tf32(patches, applied)
        elif rule == "metric-sync":
            _metrics(patches, applied)
        elif rule in ("no-amp", "cpu-bf16"):
            root.on_root.append(functools.partial(
                _autocast, rule=rule, applied=applied, patches=patches, switch=switch,
                channels_last=bool(options.get("channels_last", True)),
            ))
        elif rule == "launch-bound":
            root.on_root.append(
                functools.partial(_compile, applied=applied, mode=options.get("mode"))
            )
        else:
            applied.skipped[rule] = "not a fix trainprof can apply at runtime"
    if root.on_root:
        root.install()


# ----- DataLoader ------------------------------------------------------------------------------
def _dataloader_init(patches: Patches, change: Callable[[dict], None]) -> None:
    from torch.utils.data import DataLoader

    edit_init(patches, DataLoader, change)


def _dataloader(patches: Patches, options: dict, user: UserCode, applied: Applied) -> None:
    if options.get("control"):  # the thread change alone
        torch.set_num_threads(int(options["threads"]))
        return
    n = int(options.get("num_workers", 0))
    # Evaluation loaders the script leaves before their end, by where they are built (the
    # location as `run` recorded it: capture/metadata)
    evaluation = set(options.get("evaluation_loaders") or ())

    def change(a: dict) -> None:
        if a.get("batch_sampler") is None and a.get("batch_size", 1) is None:
            return  # batch_size=None: the dataset yields batches itself, left alone
        a["num_workers"] = n
        if n:
            a["persistent_workers"] = True
            a["prefetch_factor"] = PREFETCH
            where = user.location(sys._getframe()) if evaluation else None
            if where in evaluation:
                a["prefetch_factor"] = EVAL_PREFETCH
                note = (f"prefetch_factor={EVAL_PREFETCH} for the evaluation DataLoader built at "
                        f"{place_names([str(where)])}")
                if note not in applied.notes:
                    applied.notes.append(note)
        else:  # DataLoader refuses these without workers
            a["persistent_workers"] = False
            a["prefetch_factor"] = None

    _dataloader_init(patches, change)
    if n:
        _workers_end_with_round(patches)
    if options.get("threads"):
        torch.set_num_threads(int(options["threads"]))


def _workers_end_with_round(patches: Patches) -> None:
    """The fix's persistent workers stop when the round ends (at restore), as they would when
    their iterator is freed. Left to the interpreter's exit, with the script's loader in its
    globals still holding them, multiprocessing's exit handler terminates them first, and each
    leaves its temporary folder behind (/tmp/pymp-*, a socket it shared batches through): three a
    round in tests/scripts/try_turns.py, as plain PyTorch leaves with persistent_workers=True
    and a global loader."""
    from torch.utils.data import dataloader

    live: weakref.WeakSet = weakref.WeakSet()

    def make(orig: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(orig)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            live.add(self)

        return __init__

    def stop() -> None:
        for it in list(live):
            try:
                it._shutdown_workers()
            except Exception:  # noqa: BLE001 - the interpreter's exit stops them as before
                pass

    patches.wrap(dataloader._MultiProcessingDataLoaderIter, "__init__", make)
    patches.on_restore(stop)


def _sharing_strategy(patches: Patches, applied: Applied, strategy: str) -> None:
    """torch.multiprocessing's strategy for sharing CPU tensors, in this process (set before the
    script builds a DataLoader, so forked workers inherit it; undone at restore) and in every
    DataLoader worker (a worker started by spawn or forkserver imports torch afresh, with the
    default strategy; the worker picks the strategy when it sends a batch)."""
    import torch.multiprocessing as tmp

    if strategy not in tmp.get_all_sharing_strategies():
        applied.skipped["dataloader-starvation"] = (
            f"torch has no {strategy!r} sharing strategy on this system"
        )
        return
    old = tmp.get_sharing_strategy()
    tmp.set_sharing_strategy(strategy)
    patches.on_restore(lambda: tmp.set_sharing_strategy(old))

    def change(a: dict) -> None:
        a["worker_init_fn"] = functools.partial(
            worker_sharing_strategy, strategy, a.get("worker_init_fn")
        )

    _dataloader_init(patches, change)
    applied.notes.append(f"sharing strategy {strategy!r} in the script and its DataLoader workers")


def worker_sharing_strategy(
    strategy: str, inner: Callable[[int], Any] | None, worker_id: int
) -> None:
    """A DataLoader worker's init function: the strategy, then the script's own init (if any).
    Module-level, so that a spawned worker can unpickle it."""
    import torch.multiprocessing as tmp

    tmp.set_sharing_strategy(strategy)
    if inner is not None:
        inner(worker_id)


def _pinned(
    patches: Patches, applied: Applied, rule: str = "pageable-memcpy", copies: bool = True
) -> None:
    """pin_memory=True for every DataLoader; with `copies`, non_blocking=True for host-to-device
    copies from pinned memory too (pageable-memcpy's fix; dataloader-starvation's receiving kind
    wants only the pin-memory thread, which takes the receiving of batches off the loop)."""
    if not cuda_available():
        applied.skipped[rule] = (
            "no CUDA device: no host-to-device copy to speed up" if copies
            else "no CUDA device: DataLoader(pin_memory=True) does nothing"
        )
        return

    def change(a: dict) -> None:
        a["pin_memory"] = True

    _dataloader_init(patches, change)
    if not copies:
        return

    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def to(self: Any, *args: Any, **kwargs: Any) -> Any:
            # Only host-to-device copies from pinned memory: others gain nothing or are unsafe.
            if self.device.type == "cpu" and self.is_pinned() and _to_cuda(args, kwargs):
                kwargs["non_blocking"] = True
            return orig(self, *args, **kwargs)

        return to

    patches.wrap(torch.Tensor, "to", make)


def _to_cuda(args: tuple, kwargs: dict) -> bool:
    dev = kwargs.get("device", args[0] if args else None)
    if isinstance(dev, str):
        return dev.startswith("cuda")
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    return isinstance(dev, int) and not isinstance(dev, bool)


# ----- optimizers ------------------------------------------------------------------------------
def _zero_grad(patches: Patches, switch: Switch) -> None:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def zero_grad(self: Any, set_to_none: bool = True) -> Any:
            return orig(self, set_to_none=True if switch.on else set_to_none)

        return zero_grad

    patches.wrap(torch.optim.Optimizer, "zero_grad", make)
    patches.wrap(torch.nn.Module, "zero_grad", make)


def _optimizer(patches: Patches, switch: Switch) -> None:
    for name in dir(torch.optim):
        cls = getattr(torch.optim, name)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            continue
        if "__init__" not in vars(cls):
            continue
        params = inspect.signature(cls.__init__).parameters
        if "foreach" not in params:
            continue
        patches.wrap(cls, "__init__", functools.partial(
            _optimizer_init, fused="fused" in params, switch=switch,
            unfixed={k: params[k].default for k in ("foreach", "fused") if k in params},
        ))


def _optimizer_init(
    orig: Callable[..., None], fused: bool, switch: Switch, unfixed: dict[str, Any]
) -> Callable[..., None]:
    """`unfixed`: the class's defaults of foreach and fused, what the script's optimizer has
    where it did not pass them (the flags the switch restores when off)."""

    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("foreach") or kwargs.get("fused") or getattr(self, "_trainprof_fix", 0):
            return orig(self, *args, **kwargs)
        off = {k: kwargs.get(k, v) for k, v in unfixed.items()}
        _follow_switch(self, switch, off)
        self._trainprof_fix = 1  # a subclass calling super().__init__ is patched once
        args = tuple(args)
        params = list(args[0]) if args and not isinstance(args[0], torch.Tensor) else None
        if params is not None:  # a generator would be used up by the first attempt
            args = (params, *args[1:])
        elif "params" in kwargs:
            kwargs["params"] = list(kwargs["params"])
        try:
            if fused and fused_ok(params if params is not None else kwargs.get("params")):
                try:
                    return orig(self, *args, **{**kwargs, "fused": True, "foreach": False})
                except (RuntimeError, ValueError, TypeError):
                    pass  # a device or dtype fused does not support: foreach
            return orig(self, *args, **{**kwargs, "foreach": True})
        finally:
            self._trainprof_fix = 0
            if not switch.on:  # made with the fix (fused checked), run as the script made it
                _optimizer_flags(weakref.ref(self), off, False)

    return __init__


def _follow_switch(opt: Any, switch: Switch, off: dict[str, Any]) -> None:
    """The optimizer's foreach/fused flags follow the switch: torch.optim reads them from its
    param groups at each step()."""
    ref = weakref.ref(opt)  # the switch does not keep the script's optimizer alive
    switch.when_changed(lambda on: _optimizer_flags(ref, off, on))


def _optimizer_flags(ref: weakref.ref, off: dict[str, Any], on: bool) -> None:
    opt = ref()
    if opt is None or not hasattr(opt, "param_groups"):
        return
    if not hasattr(opt, "_trainprof_fixed"):  # the flags the fix gave it, read once
        opt._trainprof_fixed = (
            {k: opt.defaults.get(k) for k in off},
            vars(opt).get("_step_supports_amp_scaling", False),  # fused: GradScaler's hand-off
        )
    flags, amp = opt._trainprof_fixed
    flags = flags if on else off
    for group in [*opt.param_groups, opt.defaults]:
        group.update(flags)
    opt._step_supports_amp_scaling = amp if on else bool(flags.get("fused"))


# ----- backend flags (CUDA) --------------------------------------------------------------------
def _cudnn_benchmark(patches: Patches, applied: Applied) -> None:
    if not cuda_available():
        applied.skipped["cudnn-benchmark-off"] = "no CUDA device: cuDNN is not used"
        return
    torch.backends.cudnn.benchmark = True
    # Held: a later `torch.backends.cudnn.benchmark = False` in the script is ignored.
    prop = type(torch.backends.cudnn).__dict__.get("benchmark")
    patches.set(
        type(torch.backends.cudnn),
        "benchmark",
        property(lambda m: True, lambda m, v: None if prop is None else prop.__set__(m, True)),
    )


def _tf32(patches: Patches, applied: Applied) -> None:
    if not cuda_available():
        applied.skipped["tf32-off"] = "no CUDA device: TF32 is a GPU format"
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    patches.set(torch, "set_float32_matmul_precision", lambda precision: None)
    cls = type(torch.backends.cuda.matmul)
    orig_set = cls.__setattr__

    def setattr_(self: Any, name: str, value: Any) -> None:
        orig_set(self, name, True if name == "allow_tf32" else value)

    patches.set(cls, "__setattr__", setattr_)
    prop = type(torch.backends.cudnn).__dict__.get("allow_tf32")
    if prop is not None:
        patches.set(
            type(torch.backends.cudnn),
            "allow_tf32",
            property(lambda m: prop.__get__(m), lambda m, v: prop.__set__(m, True)),
        )


# ----- TorchMetrics ----------------------------------------------------------------------------
def _metrics(patches: Patches, applied: Applied) -> None:
    try:
        from torchmetrics.aggregation import BaseAggregator
    except ImportError:
        applied.skipped["metric-sync"] = "TorchMetrics is not installed"
        return

    def change(args: dict) -> None:
        args["nan_strategy"] = "disable"  # no NaN check: no host sync per update

    edit_init(patches, BaseAggregator, change)


# ----- the root module: autocast, compile ------------------------------------------------------
class _RootFinder:
    """Finds the model: the first module with trainable parameters called outside any other
    module, on the script's thread. Global hooks (which slow every module call) are removed as
    soon as it is found; the fixes then patch that one instance."""

    def __init__(self, patches: Patches) -> None:
        self.patches = patches
        self.on_root: list[Callable[[torch.nn.Module], None]] = []
        self.depth = 0
        self.handles: list[Any] = []
        self.found = False
        self.thread = threading.get_ident()

    def install(self) -> None:
        from torch.nn.modules import module as m

        self.handles = [
            m.register_module_forward_pre_hook(self._pre),
            m.register_module_forward_hook(self._post, always_call=True),
        ]
        self.patches.on_restore(self._remove)

    def _remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if threading.get_ident() != self.thread or os.getpid() != _PID:
            return
        self.depth += 1
        if self.depth != 1 or self.found:
            return
        if not any(p.requires_grad for p in module.parameters()):
            return  # a loss, a metric, a frozen feature extractor
        self.found = True
        for fix in self.on_root:
            fix(module)

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if threading.get_ident() != self.thread or os.getpid() != _PID:
            return
        self.depth = max(0, self.depth - 1)
        if self.found and not self.depth:
            self._remove()


_PID = os.getpid()


def _device_type(module: torch.nn.Module) -> str:
    p = next(module.parameters(), None)
    return p.device.type if p is not None else "cpu"


def _autocast(
    module: torch.nn.Module, rule: str, applied: Applied, patches: Patches, switch: Switch,
    channels_last: bool = True,
) -> None:
    device = _device_type(module)
    if device == "cuda" and not torch.cuda.is_bf16_supported():
        applied.skipped[rule] = (
            "this GPU has no bf16; fp16 needs a GradScaler in the loop: edit the code"
        )
        return
    if device not in ("cuda", "cpu"):
        applied.skipped[rule] = f"autocast on {device} is not tried"
        return
    # On a CPU, a CNN's weights and 4-D inputs are converted to channels-last, unless the run's
    # model probe measured the model's own layout faster under bf16 (`channels_last` False: the
    # layout cpu-bf16's estimate was for, analysis/bf16_layout).
    was_cl = channels_last_now(module)
    cl = install_autocast(module, device, lambda: switch.on, channels_last)
    if cl and not was_cl:
        _layout_follows(module, patches, switch)
    applied.notes.append(
        f"bf16 autocast on {type(module).__name__}.forward ({device})"
        + (", channels-last weights and inputs" if cl else "")
        + (", its own layout kept (faster under bf16 in the run's model probe)"
           if not channels_last and device == "cpu" and is_cnn(module) else "")
    )
    # the model is kept by the script; undone with the process (rounds are one process each)


def _layout_follows(module: torch.nn.Module, patches: Patches, switch: Switch) -> None:
    """The fix's channels-last weights follow the switch: off, the module is converted back to
    the script's layout at the step boundary, on, to channels-last again; and the optimizers'
    state of those weights (a momentum buffer, Adam's moments) with them, at their next step()
    (the block's transition step, not timed): left in the other layout, every update would mix
    the two."""
    epoch = [0]
    four = {id(p) for p in module.parameters() if p.dim() == 4}

    def flip(on: bool) -> None:
        module.to(memory_format=torch.channels_last if on else torch.contiguous_format)
        epoch[0] += 1

    def convert_state(opt: Any, args: Any, kwargs: Any) -> None:
        if getattr(opt, "_trainprof_layout", 0) == epoch[0]:
            return
        opt._trainprof_layout = epoch[0]
        fmt = torch.channels_last if switch.on else torch.contiguous_format
        for group in opt.param_groups:
            for p in group["params"]:
                state = opt.state.get(p) if id(p) in four else None
                for k, t in (state or {}).items():
                    if isinstance(t, torch.Tensor) and t.shape == p.shape:
                        state[k] = t.contiguous(memory_format=fmt)

    switch.when_changed(flip)
    if not switch.on:  # found in a step run without the fix: back to the script's layout
        flip(False)
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    patches.on_restore(register_optimizer_step_pre_hook(convert_state).remove)


def _compile(module: torch.nn.Module, applied: Applied, mode: str | None = None) -> None:
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        counters = None
    try:
        compiled = torch.compile(module._call_impl, mode=mode)
    except Exception as err:  # noqa: BLE001 - a failure to compile is reported, not fatal
        applied.failed["launch-bound"] = f"torch.compile failed: {type(err).__name__}: {err}"
        return
    state = {"failed": False}
    plain = module._call_impl

    def call(*args: Any, **kwargs: Any) -> Any:
        if state["failed"]:
            return plain(*args, **kwargs)
        before = counters["stats"]["unique_graphs"] if counters is not None else None
        try:
            out = compiled(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - run on uncompiled; the fix is reported failed
            state["failed"] = True
            msg = str(err).strip().splitlines()[0] if str(err).strip() else ""
            applied.failed["launch-bound"] = f"torch.compile failed: {type(err).__name__}: {msg}"
            return plain(*args, **kwargs)
        if counters is None or counters["stats"]["unique_graphs"] != before:
            applied.compile_steps.append(applied.step_of())
        return out

    module._compiled_call_impl = call  # what nn.Module.compile() sets: __call__ uses it
    how = f'(mode="{mode}") ' if mode else ""
    applied.notes.append(f"torch.compile {how}on {type(module).__name__}")
