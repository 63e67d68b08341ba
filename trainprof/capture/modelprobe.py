"""The user's own model, forward + backward on its last training batch: fp32 as the script ran it
vs what `trainprof try --fix cpu-bf16` applies (capture/bf16fix: bf16 autocast, fp32 outputs),
for a CNN in both layouts the fix can leave it in, channels-last and the script's own (which is
faster depends on the model: on random batches a two-conv CNN ran 10 % faster in its own layout,
a ResNet-18 10 % slower; analysis/bf16_layout takes the faster). Timed after the script ends,
for cpu-bf16's estimate. Also (`thread_times`) fp32 at the intra-op thread counts DataLoader
workers would leave the model, for dataloader-starvation's CPU estimate.

Per-operator speed-up curves applied to traced operator times (capture/cpumath) stayed far from
what the fix measured on CNNs (amp_compile: 36 % estimated, 59 % measured): the layout change
speeds up or slows down every layer, autocast adds casts between them, and the profiler inflates
the traced times (~27,000 page faults per fp32 step). Timing the model itself measures all of
that at once.

The user's objects are never changed: two deep copies of the module are timed, three for a CNN
(BatchNorm running statistics and .grad of the script's model stay as they are), on the last
batch's tensors (cloned for the probe: a forward that writes into its input writes into the clone).
One intra-op thread, CPU time of this thread (as cpumath: a shared machine's preemptions are not
counted), the least of a few interleaved runs after a warm-up of each; and when the script ran
several intra-op threads, the pair again with that many, in wall time (bf16's gain is smaller
there: the casts and small kernels do not split over threads as the matmuls do). Skipped, with the
reason, when the model is larger than MAX_MODEL_BYTES, is compiled, cannot be copied or called, or
one fp32 forward + backward takes over MAX_CALL_S; the whole probe stops adding runs after BUDGET_S
(half as much again for a CNN's third copy). A fixed piece of work is timed after each pair, its
least kept (`ref_ms`): the speed the pairs ran at, against the speed of the run's steps
(capture/phaseref).

CPU time includes the kernel's time in page faults, on purpose: with glibc's default malloc an
fp32 NCHW CNN takes 10,000-26,000 page faults per forward + backward (large activations handed
back to the OS and faulted in again), in the script's loop as in the probe, and its bf16
channels-last run almost none. amp_compile, one thread: the probe's fp32 146-183 ms beside the
run's own steps of 166-187 ms; with fixed malloc thresholds (benchmarks/fix_efficacy.py) 137 ms
beside 135 ms. User time alone (which leaves the faults out) would understate what the fix saves
such a loop.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainprof.capture.bf16fix import channels_last_now, install_autocast
from trainprof.capture.cputime import cpu_time, least_interleaved, wall_time
from trainprof.capture.phaseref import least_ms, reference
from trainprof.errors import one_line
from trainprof.runmeta import RunMeta

MAX_MODEL_BYTES = 512 << 20  # parameters + buffers: two or three copies are made
MAX_CALL_S = 1.0  # one fp32 forward + backward (the warm-up, CPU time): longer ones are skipped
BUDGET_S = 2.0  # wall time from the warm-ups on after which no more timed runs are started
# (for the pair: a CNN's third copy adds its share, so that a large model keeps as many runs of
# each as before; THREADS_BUDGET_S likewise)
MAX_REPS = 20  # 5 left the ratio of a small CNN spread over 0.35-0.48 between probes; 20: 0.44-0.48
THREADS_BUDGET_S = 1.5  # wall time for the timed runs at several threads, after one warm-up each
THREADS_REPS = 50  # timed runs of each thread count at most (interleaved): with 7, a 1-2 ms
# model's least moved 0.9-1.8 ms at 2 threads between identical runs


@dataclass(frozen=True)
class ModelTimes:
    """One forward + backward of the model, ms of CPU time on one thread; or why not."""

    fp32_ms: float | None = None
    bf16_ms: float | None = None  # the fix as install_autocast applies it by default
    # A CNN in the script's own layout (not channels-last) under bf16 too: the fix's other
    # layout (None: not a CNN, channels-last already, or not timed).
    bf16_own_layout_ms: float | None = None
    reps: int = 0  # timed runs of each after the warm-up (0: the warm-ups' times)
    model: str = ""  # the root module's class name
    channels_last: bool = False  # the fix made the copy channels-last (a CNN)
    skipped: str = ""  # why there are no times (empty when there are)
    # The same pair at the script's intra-op thread count when over one, WALL time (the threads'
    # work together): bf16's gain shrinks with threads (Lightning's MLP: 0.48x on one, 0.60x on
    # two), and the loop ran with the script's. None when the script ran one thread.
    threads: int = 1
    fp32_threads_ms: float | None = None
    bf16_threads_ms: float | None = None
    bf16_own_layout_threads_ms: float | None = None
    # The least of a fixed piece of work timed after each pair (capture/phaseref): the speed the
    # machine ran the pairs at, against its speed at the run's steps. None: not timed.
    ref_ms: float | None = None


def _float_sum(out: Any) -> torch.Tensor | None:
    """The float tensors of a model's output that carry a gradient, summed (in fp32)."""
    todo, parts = [out], []
    while todo:
        x = todo.pop()
        if isinstance(x, torch.Tensor):
            if x.is_floating_point() and x.requires_grad:
                parts.append(x.float().sum())
        elif isinstance(x, (tuple, list)):
            todo.extend(x)
        elif isinstance(x, dict):  # dicts, HF ModelOutput (an OrderedDict)
            todo.extend(x.values())
    return torch.stack(parts).sum() if parts else None


def _step(module: torch.nn.Module, args: tuple, kwargs: dict) -> Callable[[], None]:
    def run() -> None:
        loss = _float_sum(module(*args, **kwargs))
        if loss is None:
            raise ValueError("the model's output has no float tensor with a gradient")
        loss.backward()
        for p in module.parameters():
            p.grad = None

    return run


def _cloned(x: Any) -> Any:
    """`x` with its tensors cloned (tuples, lists, dicts walked; other objects as they are)."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (tuple, list)):
        items = [_cloned(v) for v in x]
        return tuple(items) if isinstance(x, tuple) else items
    if isinstance(x, dict) and type(x) is dict:
        return {k: _cloned(v) for k, v in x.items()}
    return x


def _model_bytes(module: torch.nn.Module) -> int:
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def _not_copied(module: torch.nn.Module) -> str:
    """Why the probes do not time a copy of `module` (empty: they do)."""
    if hasattr(module, "_orig_mod") or type(module).__name__ == "OptimizedModule":
        return "a torch.compile'd model (compiling a copy is slow)"
    size = _model_bytes(module)
    if size > MAX_MODEL_BYTES:
        return f"the model is too large to copy ({size >> 20} MiB)"
    return ""


def time_model(module: torch.nn.Module, args: tuple, kwargs: dict) -> ModelTimes:
    """Forward + backward of copies of `module` on (args, kwargs): fp32 vs the bf16 fix."""
    name = type(module).__name__
    why = _not_copied(module)
    if why:
        return ModelTimes(model=name, skipped=why)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # fork_rng: dropout draws leave the script's RNG alone; enable_grad: the script may have
        # switched gradients off globally before it ended.
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            m32, m16 = copy.deepcopy(module), copy.deepcopy(module)
            args, kwargs = _cloned(args), _cloned(kwargs)
            for m in (m32, m16):
                m.train()  # as it was when the batch was kept
                for p in m.parameters():
                    p.grad = None
            # A CNN not channels-last already: bf16 in its own layout too, the fix's other layout.
            cl = install_autocast(m16, "cpu")
            own = cl and not channels_last_now(module)
            runs = [_step(m32, args, kwargs), _step(m16, args, kwargs)]
            if own:
                m16k = copy.deepcopy(m32)
                install_autocast(m16k, "cpu", channels_last=False)
                runs.append(_step(m16k, args, kwargs))
            started = time.perf_counter()
            first = cpu_time(runs[0])  # warm-up: oneDNN builds its kernels on the first call
            if first > MAX_CALL_S:
                return ModelTimes(
                    model=name,
                    skipped=f"one fp32 forward + backward took {first:.1f} s (over {MAX_CALL_S} s)",
                )
            firsts = [first, *(cpu_time(run) for run in runs[1:])]
            # A model slow enough that the warm-ups used the budget up: their times stand (they
            # include building oneDNN's kernels, a small part of a call this long).
            refs: list[float] = []
            best, reps = least_interleaved(
                runs, MAX_REPS, BUDGET_S * len(runs) / 2, started,
                lambda: refs.append(reference()),
            )
            best = [min(b, f) for b, f in zip(best, firsts, strict=True)]
            many = _at_threads(runs, threads, refs) if threads > 1 else None
    except Exception as err:  # noqa: BLE001 - any failure means the curve estimate instead
        return ModelTimes(model=name, skipped=f"the copy or its call failed: {one_line(err)}")
    finally:
        torch.set_num_threads(threads)
    ms = [round(b * 1e3, 3) for b in best]
    ms_many = [round(b * 1e3, 3) for b in many] if many else [None] * len(runs)
    return ModelTimes(
        fp32_ms=ms[0], bf16_ms=ms[1], reps=reps, model=name, channels_last=cl,
        threads=threads, fp32_threads_ms=ms_many[0], bf16_threads_ms=ms_many[1],
        bf16_own_layout_ms=ms[2] if own else None,
        bf16_own_layout_threads_ms=ms_many[2] if own else None,
        ref_ms=least_ms(refs),
    )  # fmt: skip


def _at_threads(
    runs: list[Callable[[], None]], threads: int, refs: list[float]
) -> list[float] | None:
    """[fp32 s, then each bf16 variant's s] of wall time with `threads` intra-op threads after a
    warm-up of each (a pool of that size started, kernels for it built), run in turn: fp32 the
    least of its runs, each other that times the median of its time / fp32's over the same
    turns. A VM's vCPUs change speed for seconds at a time and a wall clock sees it (CPU time
    cannot be had for the other threads): one fp32 run in a fast second made metrics_sync's
    ResNet 0.84x where its probes measure 0.68-0.74x; runs of one turn share their second. None
    when the warm-ups alone used the budget up. The reference (capture/phaseref) is timed after
    each turn, into `refs`."""
    torch.set_num_threads(threads)
    budget = THREADS_BUDGET_S * len(runs) / 2
    started = time.perf_counter()
    for run in runs:  # the warm-ups
        run()
    if time.perf_counter() - started > budget:
        return None
    started = time.perf_counter()
    turns: list[list[float]] = []
    while len(turns) < THREADS_REPS and time.perf_counter() - started < budget:
        turns.append([wall_time(run) for run in runs])
        refs.append(reference())
    best = min(t[0] for t in turns)
    return [best] + [best * statistics.median(t[i] / t[0] for t in turns)
                     for i in range(1, len(runs))]


def thread_times(
    module: torch.nn.Module, args: tuple, kwargs: dict, threads: list[int]
) -> tuple[list[list[float]], str]:
    """([[threads, ms], ...], why not): one fp32 forward + backward of a copy of `module` on
    (args, kwargs) with each intra-op thread count, WALL time (the threads' work together), the
    least of interleaved runs after a warm-up of each. For dataloader-starvation's CPU model:
    workers take cores from the model's threads, and how the model's step grows with fewer
    threads is the model's own (try_fakedata's CNN: 5.6 ms with 2 threads, 8 ms with one)."""
    why = _not_copied(module)
    if why:
        return [], why
    saved = torch.get_num_threads()
    best: dict[int, float] = {}
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            copy_ = copy.deepcopy(module)
            copy_.train()
            for p in copy_.parameters():
                p.grad = None
            run = _step(copy_, _cloned(args), _cloned(kwargs))
            warm = time.perf_counter()
            for n in threads:  # warm-ups: kernels built, the pool of each size started
                torch.set_num_threads(n)
                best[n] = wall_time(run)
                if best[n] > MAX_CALL_S:
                    return [], f"one forward + backward took over {MAX_CALL_S} s"
            # A model slow enough that the warm-ups used the budget up: their times stand (they
            # include building kernels, a small part of a call this long).
            started = time.perf_counter()
            reps = 0 if started - warm > THREADS_BUDGET_S else THREADS_REPS
            for rep in range(reps):
                if rep and time.perf_counter() - started > THREADS_BUDGET_S:
                    break
                for n in threads:
                    torch.set_num_threads(n)
                    best[n] = min(best[n], wall_time(run))
    except Exception as err:  # noqa: BLE001 - no scaling figures: the model's threads as run
        return [], f"the copy or its call failed: {one_line(err)}"
    finally:
        torch.set_num_threads(saved)
    return [[n, round(best[n] * 1e3, 3)] for n in threads], ""


def thread_counts(run_threads: int, cores: int) -> list[int]:
    """The intra-op thread counts the model is timed with for dataloader-starvation: the run's,
    one, and what one or two workers would leave of the cores (the CPU model interpolates
    between them in 1/threads, Amdahl's law being linear there)."""
    want = {max(1, run_threads), 1, max(1, cores - 1), max(1, cores - 2)}
    return sorted(want, reverse=True)


def loader_probe(meta: RunMeta, call: tuple[Any, tuple, dict] | None) -> None:
    """Fill meta.loader_ipc's model thread figures (capture/loaderipc ran: a CPU run fetching
    without workers, where the fix would take cores from the model's threads)."""
    ipc = meta.loader_ipc
    if ipc is None:
        return
    if call is None:
        ipc.model_threads_skipped = "no training call of the model was kept"
        return
    counts = thread_counts(meta.torch_threads or torch.get_num_threads(), meta.cpu_count or 1)
    ipc.model_threads_ms, ipc.model_threads_skipped = thread_times(*call, counts)
