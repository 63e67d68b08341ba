"""`trainprof/...` record_function ranges around what a diagnosis needs and torch does not label.

* `trainprof/fetch`: DataLoader iterator __next__ (also a step boundary for the stepper),
* `trainprof/forward`: the root module's forward (outermost nn.Module call, metrics excluded);
  one in eval mode with grad off is also inside `trainprof/eval:...` (capture/evaluation),
* `trainprof/backward`: torch.autograd.backward (Tensor.backward goes through it),
* `trainprof/host_read:<kind>@<file>:<line>`: Tensor.item / tolist / cpu / numpy / __bool__ by user
  code (directly, or through a library when the tensor is not on the CPU); file:line is the
  first user frame, in the name so the diagnosis has it even without with_stack. The time in
  these reads is also summed per step, in every step (the stepper's `sync_times`).
* no range, a timer: Tensor.to / Tensor.cuda of a CPU tensor onto a device, on the script's
  thread outside a fetch, summed per step in every step (the stepper's `copy_times`).

Every wrapper checks one boolean (S.recording) and otherwise calls straight through, but for
the host reads and the host copies, timed in every step (a perf_counter pair). The root
forward uses a global pre-hook that removes itself for the duration of the root call, so nested
modules keep nn.Module's hook-free fast path.
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.profiler import record_function

from trainprof.capture.compat import is_compiling
from trainprof.capture.evaluation import EVAL_RANGE, EvalSupport, is_eval_forward
from trainprof.capture.patching import Patches
from trainprof.capture.state import S, on_fork_child
from trainprof.capture.stepper import GENERIC_EVAL, Stepper
from trainprof.capture.userframe import UserCode

# __bool__ is `if tensor:` (aten::is_nonzero): Kineto's Python frames cannot give its line (a
# frame already running when the window opened keeps the line it was at then).
HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__")
# Host-to-device copies: from pageable memory `.to(device)` returns only once the batch is
# staged, and with non_blocking=False after a stream sync (pageable-memcpy's).
HOST_COPIES = ("to", "cuda")


def probe(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` inside a `name` range while recording; a plain call otherwise."""

    @functools.wraps(fn)
    def probed(*args: Any, **kwargs: Any) -> Any:
        if is_compiling() or not S.recording:  # see stepper's docstring on is_compiling
            return fn(*args, **kwargs)
        with record_function(name):
            return fn(*args, **kwargs)

    return probed


def install_probes(patches: Patches, stepper: Stepper, user: UserCode) -> _RootForward:
    """Installs every probe; returns the root-forward probe, which also learns what layers the
    model has (`conv_seen`, `linear_seen`). The frameworks' evaluation loops are probed here too,
    beside the root forward's plain-loop evaluation: whatever times steps must tell both."""
    _install_fetch(patches, stepper)
    root = _RootForward(stepper)
    root.install(patches)
    _install_backward(patches, stepper)
    for kind in HOST_READS:
        patches.wrap(
            torch.Tensor, kind, lambda orig, kind=kind: _host_read(kind, orig, user, stepper)
        )
    for kind in HOST_COPIES:
        patches.wrap(torch.Tensor, kind, lambda orig: _host_copy(orig, stepper))
    EvalSupport(patches, stepper).install()
    return root


MAX_BATCH_TENSORS = 64  # a batch with more tensors is described by its first 64


def batch_spec(batch: Any) -> list[tuple[list[int], str]]:
    """(shape, dtype) of the CPU tensors in a batch (tuples, lists and dicts walked, at most
    MAX_BATCH_TENSORS): what capture/loaderipc sends between processes to time a worker's
    hand-over."""
    out: list[tuple[list[int], str]] = []
    todo = [batch]
    while todo and len(out) < MAX_BATCH_TENSORS:
        x = todo.pop()
        if isinstance(x, torch.Tensor):
            if x.device.type == "cpu" and not x.is_sparse:
                out.append((list(x.shape), str(x.dtype).removeprefix("torch.")))
        elif isinstance(x, (tuple, list)):
            todo.extend(reversed(x[:MAX_BATCH_TENSORS]))
        elif isinstance(x, dict):
            todo.extend(list(x.values())[:MAX_BATCH_TENSORS])
    return out


def _install_fetch(patches: Patches, stepper: Stepper) -> None:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    get_ident = threading.get_ident

    def make(orig: Callable[[Any], Any]) -> Callable[[Any], Any]:
        fetch = probe("trainprof/fetch", orig)  # another thread's fetch: a range only

        # The loop's fetch: one frame between it and torch's __next__, not probe()'s two: the
        # dataset's code runs below it, and some of it costs in proportion to the stack's depth
        # (handoff.py).
        @functools.wraps(orig)
        def __next__(self: Any) -> Any:
            if is_compiling() or not S.enabled or get_ident() != S.main_thread:
                return fetch(self)
            stepper.on_fetch_begin()
            if stepper.before_fetch is not None and not S.fetch_depth:
                stepper.before_fetch(self)
            S.fetch_depth += 1
            try:
                if S.recording:
                    with record_function("trainprof/fetch"):
                        batch = orig(self)
                else:
                    batch = orig(self)
            finally:
                S.fetch_depth -= 1
            stepper.on_fetch_end(self)
            if stepper.first_batch is None and not S.fetch_depth:
                stepper.first_batch = batch_spec(batch)
            if stepper.after_fetch is not None and not S.fetch_depth:
                stepper.after_fetch(self, batch)
            return batch

        return __next__

    patches.wrap(_BaseDataLoaderIter, "__next__", make)


class _RootForward:
    """`trainprof/forward` around root module calls, and a step boundary before them.

    The global pre-hook takes itself out of torch's global hook dict for the duration of a root
    call (nested modules then take nn.Module's hook-free fast path) and a forward hook on the
    root module, `always_call` so it also runs when forward raises, puts it back. Both are
    written into torch's hook dicts under ids reserved from torch's own counter: registering
    handles on every call would cost several microseconds per forward. The per-call hook is a
    partial of a module-level function with an int token, so a module pickled while it is
    attached (the script caught a Ctrl-C inside forward, then saved the model) still pickles.
    """

    def __init__(self, stepper: Stepper) -> None:
        self.stepper = stepper
        self.handle: Any = None
        self.hooks: dict[int, Any] = {}
        self.key = -1
        # What the root modules contain, looked at once per root module: whether measuring
        # bf16 conv / matmul speed after the run (capture/cpumath) can matter.
        self.conv_seen = False
        self.linear_seen = False
        self._inspected: set[int] = set()
        self._trained: set[int] = set()  # root modules seen in training mode with grad on
        # The last training call of a root module on the CPU: (module, args, kwargs), tensors
        # detached (the batch itself, not a copy: only the last one is held). After the run
        # capture/modelprobe times a copy of the model on it in fp32 and under the bf16 fix.
        self.last_call: tuple[Any, tuple, dict] | None = None

    def install(self, patches: Patches) -> None:
        from torch.nn.modules import module as torch_module
        from torch.utils.hooks import RemovableHandle

        _ROOT[0] = self
        self.hooks = torch_module._global_forward_pre_hooks
        self.handle = torch_module.register_module_forward_pre_hook(self._pre)
        self.key = RemovableHandle(OrderedDict()).id  # an id no other hook will get
        patches.on_restore(self._uninstall)
        on_fork_child(self._unregister)  # transforms that are modules run in workers: fast path

    def _inspect(self, module: Any) -> None:
        self._inspected.add(id(module))
        conv = torch.nn.modules.conv._ConvNd
        for m in module.modules():
            self.conv_seen = self.conv_seen or isinstance(m, conv)
            self.linear_seen = self.linear_seen or isinstance(m, torch.nn.Linear)

    def _register(self) -> None:
        if self.handle is not None:
            self.hooks[self.handle.id] = self._pre

    def _unregister(self) -> None:
        if self.handle is not None:
            self.hooks.pop(self.handle.id, None)

    def _uninstall(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        for token in list(_ACTIVE):  # left by a BaseException (Ctrl-C) inside a forward
            module_ref = _ACTIVE.pop(token)[0]
            module = module_ref()
            if module is not None:
                _detach(module, self.key)
        _ROOT[0] = None

    def _pre(self, module: Any, args: Any) -> None:
        if (
            is_compiling()
            or not S.enabled
            or S.fetch_depth  # nn.Module transforms in the DataLoader are not the model
            or S.backward_depth  # activation checkpointing re-runs forwards in backward
            or threading.get_ident() != S.main_thread
            or (S.metric_types and isinstance(module, S.metric_types))
        ):
            return None
        self.stepper.on_forward_root()
        if id(module) not in self._inspected:
            self._inspect(module)
        key = id(module)
        if key not in self._trained and module.training and torch.is_grad_enabled():
            # Its direct children too: DDP(model) / torch.compile(model) train, `.module` /
            # `._orig_mod` may be what the evaluation calls.
            self._trained.update([key, *map(id, module.children())])
        # Only a model that trains evaluates: a frozen teacher in eval mode is part of the step.
        evaluating = not S.eval_depth and key in self._trained and is_eval_forward(module)
        if evaluating:
            self.stepper.on_eval(GENERIC_EVAL)
        rf: tuple[Any, ...] = ()
        if S.recording:
            rf = (record_function(EVAL_RANGE + GENERIC_EVAL),) if evaluating else ()
            rf += (record_function("trainprof/forward"),)
            for r in rf:
                r.__enter__()
        self._unregister()
        token = next(_TOKENS)
        module._forward_hooks[self.key] = functools.partial(_root_post, token)
        module._forward_hooks_always_called[self.key] = True
        module._forward_hooks_with_kwargs[self.key] = True  # the post hook keeps the call
        # A module with trainable parameters (not a loss or a frozen teacher) training.
        keep = (
            not evaluating
            and module.training
            and torch.is_grad_enabled()
            and any(p.requires_grad for p in module.parameters())
        )
        _ACTIVE[token] = (weakref.ref(module), rf, keep)
        return None

    def keep_call(self, module: Any, args: tuple, kwargs: dict) -> None:
        """Hold this training call's inputs (detached, CPU tensors only, at most
        MAX_KEPT_BYTES) for the model probe, in place of the previous call's."""
        size = [0]
        kept = _detached((args, kwargs), size)
        if kept is None or size[0] > MAX_KEPT_BYTES:
            self.last_call = None  # not on the CPU, or too large to hold: no model probe
            return
        self.last_call = (module, kept[0], kept[1])


MAX_KEPT_BYTES = 256 << 20  # a batch larger than this is not held for the model probe


def _detached(x: Any, size: list[int]) -> Any:
    """`x` with its tensors detached (tuples, lists, dicts walked; other objects as they are);
    None when a tensor is not on the CPU. Adds the tensors' bytes to size[0]."""
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu" or x.is_sparse:
            return None
        size[0] += x.numel() * x.element_size()
        return x.detach()
    if isinstance(x, (tuple, list)):
        items = [_detached(v, size) for v in x]
        if any(v is None and w is not None for v, w in zip(items, x, strict=True)):
            return None
        return tuple(items) if isinstance(x, tuple) else items
    if isinstance(x, dict) and type(x) is dict:
        out = {k: _detached(v, size) for k, v in x.items()}
        if any(out[k] is None and x[k] is not None for k in x):
            return None
        return out
    return x


_ROOT: list[_RootForward | None] = [None]
# token -> (root module weakref, open record_functions, whether to keep the call)
_ACTIVE: dict[int, tuple[Any, Any, bool]] = {}
_TOKENS = itertools.count()


def _detach(module: Any, key: int) -> None:
    module._forward_hooks.pop(key, None)
    module._forward_hooks_always_called.pop(key, None)
    module._forward_hooks_with_kwargs.pop(key, None)


def _root_post(token: int, module: Any, inputs: Any, *rest: Any) -> None:
    """The root call's forward hook: rest is (kwargs, output), or (output,) from a module
    pickled by an older trainprof."""
    root = _ROOT[0]
    entry = _ACTIVE.pop(token, None)
    if root is None or entry is None:  # stale (pickled and reloaded, or after the run)
        return
    _detach(module, root.key)
    root._register()
    if entry[2] and len(rest) == 2:
        root.keep_call(module, inputs, rest[0])
    for rf in reversed(entry[1]):
        try:
            rf.__exit__(None, None, None)
        except Exception:  # the profiling session it belonged to may be over
            pass


def _install_backward(patches: Patches, stepper: Stepper) -> None:
    get_ident = threading.get_ident

    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if is_compiling() or not S.enabled or get_ident() != S.main_thread:
                return orig(*args, **kwargs)
            stepper.on_backward_begin()
            S.backward_depth += 1
            try:
                if S.recording:
                    with record_function("trainprof/backward"):
                        result = orig(*args, **kwargs)
                else:
                    result = orig(*args, **kwargs)
            finally:
                S.backward_depth -= 1
            stepper.on_backward_end()
            return result

        return backward

    # Tensor.backward looks up torch.autograd.backward at call time, so this covers both.
    patches.wrap(torch.autograd, "backward", make)


def _host_read(
    kind: str, orig: Callable[..., Any], user: UserCode, stepper: Stepper
) -> Callable[..., Any]:
    """`trainprof/host_read:<kind>@<user file>:<line>`, and for a read a library makes
    `...@<user file>:<line>|<library file>:<line>`. Not inside a DataLoader fetch.

    In every step, recorded or not, the time the script's thread spends inside the reads the
    range would mark (user code's, a library's of a non-CPU tensor) goes to the stepper's
    `sync_s`: outside the profiler window, the host's wait for the GPU in them without the
    profiler's overhead. One perf_counter pair per read, added to a float."""
    prefix = f"trainprof/host_read:{kind}@"
    getframe = sys._getframe
    get_ident = threading.get_ident
    clock = time.perf_counter

    @functools.wraps(orig)
    def read(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Inside a DataLoader fetch (a dataset's `__getitem__`, a sampler, a collate_fn) tensors
        # are the CPU's in any run: never a device sync. A read inside a timed one (a tensor
        # subclass's __torch_function__ reading again) is part of the outer one.
        if is_compiling() or not S.enabled or S.fetch_depth or S.reading:
            return orig(self, *args, **kwargs)
        # Library code reading a CPU tensor (Adam's step counters, per parameter) can never be a
        # device sync: skipped. User code is always recorded: on a CPU-only run its reads are
        # what would stall a GPU. Library reads of device tensors (GradScaler's found_inf,
        # Lightning's logged values) are charged to the user line that called the library,
        # followed by `|file:line` of the library line that reads (Kineto has only its `def`).
        # A device tensor's read outside the window needs no frame (~0.2 µs): looked up last.
        caller = None
        if self.is_cpu:
            caller = getframe(1)
            if not user.is_user(caller.f_code.co_filename):
                return orig(self, *args, **kwargs)
        timed = get_ident() == S.main_thread  # a step's wait is its own thread's
        name = None  # the range, in a recorded step
        if S.recording:
            if caller is None:
                caller = getframe(1)
            filename = caller.f_code.co_filename
            where = user.location(caller)
            if where is None:  # no user code above it
                return orig(self, *args, **kwargs)
            if not user.is_user(filename):
                where = f"{where}|{filename}:{caller.f_lineno}"
            name = prefix + where
        if not timed:
            if name is None:
                return orig(self, *args, **kwargs)
            with record_function(name):
                return orig(self, *args, **kwargs)
        S.reading = True
        t0 = clock()
        try:
            if name is None:
                return orig(self, *args, **kwargs)
            with record_function(name):
                return orig(self, *args, **kwargs)
        finally:
            stepper.sync_s += clock() - t0
            S.reading = False

    return read


def _host_copy(orig: Callable[..., Any], stepper: Stepper) -> Callable[..., Any]:
    """Tensor.to / Tensor.cuda, timed into the stepper's `copy_s` where it copies a CPU tensor
    onto a device on the script's thread, outside a DataLoader fetch (and a host read), in every
    step: outside the profiler window, the host's time blocked in those copies without the
    profiler. The profiler slows the host's own work (2.5x in an H100 loop with 4 DataLoader
    workers), so in the traced steps the GPU seldom has work queued when a copy synchronises
    the stream, and a wait that costs every unprofiled step is not in the trace. A CPU tensor's
    call pays one perf_counter pair (a dtype cast on the CPU too: told apart after the call);
    any other call, an attribute read."""
    get_ident = threading.get_ident
    clock = time.perf_counter

    @functools.wraps(orig)
    def copy(self: Any, *args: Any, **kwargs: Any) -> Any:
        if (
            is_compiling() or not S.enabled or S.fetch_depth or S.reading or not self.is_cpu
            or get_ident() != S.main_thread
        ):
            return orig(self, *args, **kwargs)
        t0 = clock()
        out = orig(self, *args, **kwargs)
        if out is not self and isinstance(out, torch.Tensor) and not out.is_cpu:
            stepper.copy_s += clock() - t0
        return out

    return copy
