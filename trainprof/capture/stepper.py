"""Finding training steps without user code, and advancing the profiler schedule at each one.

Step sources, best first: optimizer > backward > dataloader > none.

* optimizer: a global optimizer step post-hook marks the end of a step; one optimizer counts,
  the *primary* one (the first whose step() ran), so several optimizers stepping per iteration
  (GAN, Muon + AdamW, per-module optimizers) still give one step per iteration, and gradient
  accumulation gives one step per optimizer step. If the primary is garbage-collected, the next
  optimizer to step takes over. A GradScaler that skips optimizer.step() (fp16 gradients with
  inf/NaN, frequent while the loss scale settles) still ends the step: `scaler.step()` returning
  without an optimizer step counts as one.
* backward: no torch optimizer (hand-written `p.data.add_(...)` updates): the end of backward()
  marks the end of a step; several backward() calls before the next forward count once.
* dataloader: neither (inference loops): a new batch fetched after a previous one was returned.

While a torch optimizer exists but has not stepped yet, backward() and batches are not counted
(gradient accumulation: the first optimizer step may come after several of them), unless more
than WAIT_FOR_OPTIMIZER of them pass first (the optimizer is not what updates the model).

A higher source seen later takes over without double counting, because a boundary is first
*pending* and applied once: right after the outermost optimizer.step() returns (outside torch's
`Optimizer.step#` range, so ranges nest), or else at the start of the next iteration (the next
DataLoader fetch or root-module forward). prof.step() is therefore never called from inside a
torch-labelled range. Inside optimizer.step() (LBFGS closures, Lightning's automatic
optimization) forward/backward are not steps; the closure runs in a `trainprof/closure` range.

Steps are numbered from 0 like ProfilerStep#N; `step_times` has the wall time of every step,
`fetch_times` the part of it spent in DataLoader fetches, `sync_times` the part spent inside the
host reads the probes wrap (`.item()`, `if tensor:`, `.tolist()`, `.cpu()`, `.numpy()`: on a GPU,
the host's wait for it), and `optimizer_times` (per optimizer class) the part spent in its
step(): outside the profiler window these are the costs without the
profiler's overhead, which inflates Python-heavy work (a fetch, a single-tensor optimizer loop)
several times over inside it. A closure given to step() (LBFGS, Lightning's automatic
optimization runs forward/backward there) is timed on every step and left out of
`optimizer_times`: the update alone (Lightning's example: AdamW's update 0.6-0.8 ms of a 5.8 ms
step, its closure's forward and backward most of the rest).
Evaluation passes (capture/evaluation calls `on_eval`) are kept by step number: those steps are
not training steps (`eval_steps` in the run metadata).

Every hook and wrapper tests `is_compiling()` first: torch.compile traces them (global hooks,
patched methods), and dynamo folds that test to a constant, so nothing of trainprof ends up in
a compiled graph, adds a graph break, or puts a guard on trainprof's flags (a recompilation
when the window opens).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerAction

from trainprof.capture.compat import is_compiling
from trainprof.capture.gpusteps import GpuStepClock
from trainprof.capture.launch import MaxStepsReached
from trainprof.capture.optprobe import OptimizerSpec, spec_of
from trainprof.capture.patching import Patches
from trainprof.capture.state import S

# Source ranks: a higher one seen later takes over.
NONE, DATALOADER, BACKWARD, OPTIMIZER = 0, 1, 2, 3
WAIT_FOR_OPTIMIZER = 64
CLOSURE_RANGE = "trainprof/closure"
GENERIC_EVAL = "model.eval() forward without grad"  # capture/evaluation's kind for plain loops
RECORDING = frozenset({ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE})


@dataclass
class StepSummary:
    source: str
    step_times: list[float]  # seconds, every completed step
    recorded: list[int]  # completed steps that were recorded (ProfilerStep numbers)
    open_step: int  # number of the ProfilerStep still open when the script ended
    open_step_recorded: bool  # that last ProfilerStep is in the trace (it runs to the script's end)
    profiler_error: str | None
    eval_steps: list[int] = field(default_factory=list)  # completed steps holding an evaluation
    eval_kinds: list[str] = field(default_factory=list)  # what evaluated, e.g. Lightning validation
    fetch_times: list[float] = field(default_factory=list)  # seconds per step in fetches
    sync_times: list[float] = field(default_factory=list)  # seconds per step in host reads
    copy_times: list[float] = field(default_factory=list)  # s per step in host-to-device copies
    optimizer_times: dict[str, list[float]] = field(default_factory=dict)  # class -> s per step
    gpu_step_times: list[float | None] = field(default_factory=list)  # capture/gpusteps.py


def _probe_closure(args: tuple, kwargs: dict, spent: list[float]) -> tuple[tuple, dict]:
    """`closure` (step(closure) / step(closure=...)) timed into `spent[0]` (every call: LBFGS
    calls it several times per step), inside a `trainprof/closure` range while recording: the
    analysis gives what runs in it to Forward/Backward and leaves Optimizer the update alone."""
    if args and callable(args[0]):
        return (_closure_probed(args[0], spent), *args[1:]), kwargs
    if callable(kwargs.get("closure")):
        return args, {**kwargs, "closure": _closure_probed(kwargs["closure"], spent)}
    return args, kwargs


def _closure_probed(closure: Callable[[], Any], spent: list[float]) -> Callable[[], Any]:
    @functools.wraps(closure)
    def closure_probed() -> Any:
        t0 = time.perf_counter()
        try:
            if not S.recording:  # the window may close inside a long LBFGS step
                return closure()
            with record_function(CLOSURE_RANGE):
                return closure()
        finally:
            spent[0] += time.perf_counter() - t0

    return closure_probed


class Stepper:
    def __init__(self, prof: Any, last_step: int | None = None) -> None:
        """`last_step`: the last step the schedule can record (None: windows repeat forever)."""
        self.prof = prof
        self.last_step = last_step
        self.profiling = True  # False once every window is saved: no more prof.step() calls
        self.source = "none"
        self._rank = NONE
        self.pending = False  # a step has ended; the profiler is advanced at the next good point
        self.pending_t = 0.0
        self.batch_out = False  # a batch was returned and no boundary followed it yet
        self.seen_forward = False
        self.t0 = time.perf_counter()
        self.step_start: float | None = None  # first activity of the current step
        self.step_times: list[float] = []
        self.gpu_clock = GpuStepClock()
        self.fetch_times: list[float] = []  # per completed step: seconds in DataLoader fetches
        self.fetch_s = 0.0  # the current step's, so far
        self.fetch_t0: float | None = None  # the outermost fetch running now started then
        self.sync_times: list[float] = []  # per completed step: seconds in probed host reads
        self.sync_s = 0.0  # the current step's, so far (added to by capture/probes' host reads)
        self.copy_times: list[float] = []  # per completed step: seconds in host-to-device copies
        self.copy_s = 0.0  # the current step's, so far (capture/probes' host copies)
        self.optimizer_times: dict[str, list[float]] = {}  # class -> seconds in step(), per step
        self.opt_s: dict[str, float] = {}  # the current step's, so far
        # class -> what the optimizer probe (capture/optprobe, after the script) needs of the
        # optimizer of that class that stepped last: its spec, not the optimizer (a reference
        # would keep it alive, and the next one would never mark steps).
        self.stepped: dict[str, OptimizerSpec] = {}
        self.stepped_ids: dict[str, int] = {}
        # (shape, dtype) of the tensors of the first batch fetched on the script's thread
        self.first_batch: list[tuple[list[int], str]] | None = None
        # the latest fetch on the script's thread: (a weak reference to its DataLoader iterator,
        # seconds), for capture/loaderfetch; weak, so an iterator's workers end when the script
        # drops it
        self.last_fetch: tuple[weakref.ref[Any] | None, float] | None = None
        self.recorded: list[int] = []
        self.primary: weakref.ref[Any] | None = None
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()  # alive torch optimizers
        self.skipped = 0  # lower-source boundaries ignored while waiting for an optimizer step
        self.optimizer_steps = 0  # optimizer.step() calls seen, any optimizer
        self.error: str | None = None
        self.max_steps = 0  # > 0: end the script at the boundary after this many steps
        self.on_window_done: Callable[[], None] | None = None  # every window recorded
        self.aside = False  # the script runs its own profiler: trainprof's stopped for good
        self.cut_step: int | None = None  # the ProfilerStep cut short by stepping aside
        self.evals: dict[int, str] = {}  # step number -> the first evaluation pass seen in it
        self.other_threads: dict[str, int] = {}  # optimizer.step() calls in other threads, by name
        self.on_step: Callable[[], None] | None = None  # after each boundary, outside step times
        # At the loop's fetch, after its step boundary: called by the fetch probe itself (one
        # frame below it: what runs there sees the loop's stack, capture/loaderfetch).
        self.before_fetch: Callable[[Any], None] | None = None
        # After it, with the iterator and its batch (capture/repeats)
        self.after_fetch: Callable[[Any, Any], None] | None = None
        # Around the prof.step() that closes a window (stops the collection, writes the trace):
        # the session's makes a Ctrl-C there wait for the trace to be saved.
        self.guard: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext

    # ----- installation -----------------------------------------------------------------------
    def install(self, patches: Patches) -> None:
        from torch.optim.optimizer import Optimizer, register_optimizer_step_post_hook

        handle = register_optimizer_step_post_hook(self._on_optimizer_post)
        patches.on_restore(handle.remove)
        patches.wrap(Optimizer, "__init__", lambda orig: self._wrap_optimizer_init(orig, patches))
        scaler = getattr(torch.amp, "GradScaler", None)  # torch.cuda.amp's subclasses it
        if scaler is not None and callable(getattr(scaler, "step", None)):
            patches.wrap(scaler, "step", self._wrap_scaler_step)

    def _wrap_scaler_step(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        stepper = self

        @functools.wraps(orig)
        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if is_compiling() or not S.enabled or threading.get_ident() != S.main_thread:
                return orig(scaler, optimizer, *args, **kwargs)
            before = stepper.optimizer_steps
            result = orig(scaler, optimizer, *args, **kwargs)
            if stepper.optimizer_steps == before:  # skipped: inf/NaN in the scaled gradients
                stepper._on_optimizer_post(optimizer, args, kwargs)
                if not S.opt_depth and stepper.pending and stepper._rank == OPTIMIZER:
                    stepper._advance()
            return result

        return step

    def _wrap_optimizer_init(
        self, orig: Callable[..., None], patches: Patches
    ) -> Callable[..., None]:
        stepper = self

        @functools.wraps(orig)
        def __init__(opt: Any, *args: Any, **kwargs: Any) -> None:
            orig(opt, *args, **kwargs)
            if S.enabled:
                stepper.optimizers.add(opt)
                stepper._wrap_step_of(type(opt), patches)

        return __init__

    def _wrap_step_of(self, cls: type, patches: Patches) -> None:
        """Wrap the step() that instances of `cls` resolve to, outside torch's own step wrapper."""
        owner = next((k for k in cls.__mro__ if "step" in vars(k)), None)
        if owner is None or owner is torch.optim.Optimizer:
            return
        inner = vars(owner)["step"]
        if getattr(inner, "_trainprof_outer", False) or not callable(inner):
            return
        stepper = self

        @functools.wraps(inner)  # copies torch's `hooked` flag, so torch does not re-wrap it
        def step(opt: Any, *args: Any, **kwargs: Any) -> Any:
            if is_compiling() or not S.enabled or threading.get_ident() != S.main_thread:
                return inner(opt, *args, **kwargs)
            outer = not S.opt_depth
            spent = [0.0]  # in the closure: forward/backward, not the update
            if outer:
                args, kwargs = _probe_closure(args, kwargs, spent)
            S.opt_depth += 1
            t0 = time.perf_counter()
            try:
                return inner(opt, *args, **kwargs)
            finally:
                if outer:
                    name = type(opt).__name__
                    took = time.perf_counter() - t0 - spent[0]
                    stepper.opt_s[name] = stepper.opt_s.get(name, 0.0) + max(took, 0.0)
                    if stepper.stepped_ids.get(name) != id(opt):  # a new one: note its spec
                        stepper.stepped[name] = spec_of(opt)
                        stepper.stepped_ids[name] = id(opt)
                S.opt_depth -= 1
                if not S.opt_depth and stepper.pending and stepper._rank == OPTIMIZER:
                    stepper._advance()

        step._trainprof_outer = True  # type: ignore[attr-defined]
        patches.set(owner, "step", step)

    # ----- events (called by the probes and hooks) ---------------------------------------------
    def _on_optimizer_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        if is_compiling() or not S.enabled:
            return
        if threading.get_ident() != S.main_thread:  # not a step; counted, to say where they ran
            name = threading.current_thread().name
            self.other_threads[name] = self.other_threads.get(name, 0) + 1
            return
        self.optimizer_steps += 1
        primary = self.primary() if self.primary is not None else None
        if primary is None:
            self.primary = weakref.ref(opt)
            primary = opt
        if opt is not primary:
            return
        self.source, self._rank = "optimizer", OPTIMIZER
        self.pending = True
        self.pending_t = time.perf_counter()

    def _waiting_for_optimizer(self) -> bool:
        """An optimizer exists but never stepped: its first step will be the step boundary."""
        if self._rank == OPTIMIZER or self.skipped > WAIT_FOR_OPTIMIZER or not self.optimizers:
            return False
        self.skipped += 1
        return True

    def on_fetch_begin(self) -> None:
        if self.pending:
            self._advance()
        elif self.batch_out and self._rank <= DATALOADER and not self._waiting_for_optimizer():
            self.source, self._rank = "dataloader", DATALOADER
            self._advance()
        elif self.step_start is None:
            self.step_start = time.perf_counter()
        self.batch_out = False
        if not S.fetch_depth:  # a loader iterated inside a dataset is part of the outer fetch
            self.fetch_t0 = time.perf_counter()

    def on_fetch_end(self, it: Any = None) -> None:
        """A fetch returned a batch; `it`: the DataLoader iterator (kept, weakly, with the
        fetch's time as `last_fetch`: capture/loaderfetch pairs a worker's fetch with it)."""
        self.batch_out = True
        if not S.fetch_depth and self.fetch_t0 is not None:
            took = time.perf_counter() - self.fetch_t0
            self.fetch_s += took
            self.fetch_t0 = None
            try:
                ref = None if it is None else weakref.ref(it)
            except TypeError:  # an iterator without weak references (__slots__)
                ref = None
            self.last_fetch = (ref, took)

    def fetched(self) -> tuple[Any, float] | None:
        """The latest fetch: (its DataLoader iterator, None once the script dropped it; the
        seconds it took), None before any."""
        last = self.last_fetch
        if last is None:
            return None
        return (last[0]() if last[0] is not None else None), last[1]

    def on_forward_root(self) -> None:
        if self.pending and not S.opt_depth:
            self._advance()
        elif self.step_start is None:
            self.step_start = time.perf_counter()
        self.seen_forward = True

    def on_backward_begin(self) -> None:
        # Without modules (purely functional models) the next backward is the next iteration.
        if self.pending and not self.seen_forward and not S.opt_depth:
            self._advance()
        elif self.step_start is None:
            self.step_start = time.perf_counter()

    def on_backward_end(self) -> None:
        if S.opt_depth or self._rank > BACKWARD or self._waiting_for_optimizer():
            return
        self.source, self._rank = "backward", BACKWARD
        self.pending = True
        self.pending_t = time.perf_counter()

    def on_eval(self, kind: str) -> None:
        """An evaluation pass starts (capture/evaluation): it belongs to the step running now,
        or, when a step has ended and the profiler is not advanced yet, to the next one."""
        self.evals.setdefault(len(self.step_times) + int(self.pending), kind)

    def _training_evals(self) -> dict[int, str]:
        """The evaluation steps worth leaving out of training statistics."""
        if self._rank < BACKWARD:  # no training (inference loop): every step evaluates
            return {}
        done = {s: k for s, k in self.evals.items() if s < len(self.step_times)}
        generic = [s for s, k in done.items() if k == GENERIC_EVAL]
        # A no-grad eval-mode forward in most steps is part of training (a frozen teacher or
        # encoder, EMA targets, RL rollouts), not an evaluation pass.
        if 2 * len(generic) > len(self.step_times):
            done = {s: k for s, k in done.items() if k != GENERIC_EVAL}
        return dict(sorted(done.items()))

    # ----- the profiler ------------------------------------------------------------------------
    @property
    def recording(self) -> bool:
        return self.profiling and self.prof.current_action in RECORDING

    def _close_parts(self) -> None:
        """The fetch, host-read and optimizer time of the step just completed."""
        n = len(self.step_times) - 1  # steps before this one
        self.fetch_times.append(self.fetch_s)
        self.fetch_s = 0.0
        self.sync_times.append(self.sync_s)
        self.sync_s = 0.0
        self.copy_times.append(self.copy_s)
        self.copy_s = 0.0
        for name in self.opt_s.keys() - self.optimizer_times.keys():
            self.optimizer_times[name] = [0.0] * n
        for name, times in self.optimizer_times.items():
            times.append(self.opt_s.get(name, 0.0))
        self.opt_s = {}

    def _advance(self) -> None:
        now = time.perf_counter()
        start = self.step_start if self.step_start is not None else self.t0
        self.gpu_clock.mark(len(self.step_times))
        self.step_times.append(now - start)
        self._close_parts()
        self.pending = False
        if self.profiling:
            if self.prof.current_action in RECORDING:
                self.recorded.append(self.prof.step_num)
            try:
                closing = self.prof.current_action == ProfilerAction.RECORD_AND_SAVE
                with self.guard() if closing else contextlib.nullcontext():
                    self.prof.step()
                if self.last_step is not None and self.prof.step_num > self.last_step:
                    # Every window is saved: stop, so that later steps cost no prof.step()
                    # (tens of microseconds each, for the rest of the training run).
                    self.prof.stop()
                    self.profiling = False
                    if self.on_window_done is not None:
                        self.on_window_done()
            except Exception as err:  # e.g. the script runs its own profiler: keep counting steps
                self.error = f"{type(err).__name__}: {err}"
                self.profiling = False
            S.recording = self.recording
        elif self.aside:  # the probes go into the script's own trace while its profiler runs
            S.recording = torch.autograd._profiler_enabled()
        if self.on_step is not None:
            self.on_step()
        self.step_start = time.perf_counter()  # a trace export inside step() is not the script's
        if self.max_steps and len(self.step_times) >= self.max_steps:
            raise MaxStepsReached(len(self.step_times))

    def step_aside(self) -> None:
        """The script starts its own profiler (Kineto runs one per process): stop trainprof's for
        good, saving what it recorded (a window being recorded is cut short), and keep counting."""
        self.aside = True
        if not self.profiling:
            return
        if self.recording:
            self.cut_step = self.prof.step_num
        self.profiling = False
        S.recording = False
        try:
            self.prof.stop()
        except Exception as err:
            self.error = f"{type(err).__name__}: {err}"

    def finish(self) -> StepSummary:
        """Close the bookkeeping at the end of the script (the runner then calls prof.stop())."""
        open_step = len(self.step_times)  # the ProfilerStep number still open
        if self.pending:  # ended, but the profiler was not advanced: the time is known
            start = self.step_start if self.step_start is not None else self.t0
            self.step_times.append(self.pending_t - start)
            self._close_parts()
            self.pending = False
        evals = self._training_evals()
        return StepSummary(
            eval_steps=list(evals),
            eval_kinds=sorted(set(evals.values())),
            source=self.source,
            step_times=self.step_times,
            recorded=self.recorded,
            open_step=open_step,
            open_step_recorded=self.recording,
            profiler_error=self.error,
            fetch_times=self.fetch_times,
            sync_times=self.sync_times,
            copy_times=self.copy_times,
            optimizer_times=self.optimizer_times,
            gpu_step_times=self.gpu_clock.times(len(self.step_times)),
        )
