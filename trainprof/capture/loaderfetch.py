"""The script's own batches fetched in a DataLoader worker between the run's steps: what a
worker spends per batch where the run's loader had none.

`dataloader-starvation`'s CPU model gives the workers the loop's fetch as their work per batch.
A worker can spend more. It runs one intra-op thread (torch sets that in its workers), so a
transform of large tensor ops that ran on the loop's threads takes longer there. And its stack
is deeper (the loop's, where iter() forked it, plus the worker loop's), which costs code that
formats the stack: FakeData seeds torch for every sample, and on a CUDA build with CUDA not
initialised torch.manual_seed queues a lazy CUDA seed with the formatted stack (in Python 3.11,
parsing each frame's line for its carets): try_fakedata's worker spent 20.3 ms per batch where
the loop spent 14.3, timed by hand over 90-270 batches. Nothing in the run shows either. The
worker must fork as the script's own would: until trainprof's check for CUDA before the script
stopped registering torch's fork handler (capture/cudacheck), it was a "bad fork" that skipped
that seed: try_fakedata's samples took it 29.8 ms per batch, 41.7 after (timed in the dataset;
the loop's 27-28.5 ms, `try`'s workers' 35-38.5).

So, on a CPU run whose loader without workers fetches in the steps (the thread steps'
conditions, capture/threadsteps), once the profiling window is saved and the thread steps are
done, the loader of the latest fetch gives its map-style dataset and collate function
(`Source`: the stepper keeps only a weak reference to the iterator, and this module the Source
until the pairs end), and in the loop's
next fetch from that dataset one DataLoader worker is forked from the loop's own stack (torch's
worker loop, one intra-op thread), with the dataset's first batches to fetch: from the fetch
probe, one frame below the loop, as a worker of the fix forks from iter() there, not from the
step boundary's frames, each of which FakeData's stack formatting pays for: try_fakedata's
worker fetch over the loop's was 1.48-1.49 forked at the boundary (26 frames deep at the
dataset), 1.35-1.40 forked in the fetch (23 deep), `try`'s workers' about 1.35 (19 deep; two
60-step runs each). That step is left out (below). At each later boundary after a step that ran
with the run's thread count (every other step during the thread steps, which start at the same
boundary, then every step) it fetches one, timed inside the worker, while this process waits (a
semaphore lets it go): the pair is that time and the loop's own fetch of its batch in the step
just ended (the stepper's `fetched()`, a loader over the same dataset). The loop's steps are
slower while the worker is there, and for a few steps after it stops: try_mlp's 0.4 ms step took
0.45-0.55 ms during the pairs and 0.36-0.40 after them and in runs without them; in a plain loop
a step after a 0.3 ms sleep took +30-60 %, the steps between two such +5-20 %, and steps beside
an idle forked child +10-100 % (larger steps move less: try_fakedata's model part, 5-7 ms,
+0.2-0.9 ms during the pairs). So every step from the fork to SETTLE steps after the worker is
stopped is recorded (`steps()`, RunMeta.worker_fetch_steps) and left out of the run's
statistics, and under --max-steps the worker is stopped early enough to leave TIMED_AFTER steps
after those, which time the step. The pairs begin once the thread steps (capture/threadsteps)
are done: a pair runs only after a step with the run's thread count, so beside the thread steps
its pause fell on every step with fewer threads and on none of the others. The Hugging Face
example's model took 1.06-1.12x as long with one thread as with two in six runs with the pairs
beside the thread steps, 0.97-1.10x (five of six at most 1.03) in six without, and
`trainprof try` measured the thread change alone at -0.5 to -2.8 %.
The worker never runs beside a step: a fetch beside another on the same cores is contention,
not either's cost (an after-the-run probe that let a worker and this process fetch at once gave
ratios of 0.6-1.9 on one dataset within a minute), and after the run this process's stack is
not the loop's (try_fakedata: 35 ms per batch there, the loop's 22 ms). Forking mid-run does not
slow the loop's steps after the pairs: try_threaded_fetch's fetch after them, three runs each
with and without them, 13.9-16.9 ms against 15.4-17.5 ms (an earlier run that seemed to say
otherwise was one of this VM's slow stretches).

What the model takes is the RATIO of the worker's fetch to the loop's, pair by pair (the
median), applied to the run's own fetch time: a shared machine's slow stretches moved the
absolute figure 2x between identical runs, and they move both sides of a pair alike. Wall time:
the worker's fetch has a core of its own (the loop waits meanwhile); the loop's is what the run
timed. In each pause the worker then fetches the next batch straight after (`warm`: each pair's
second fetch over its first; no batch fetched twice). The timed batch comes after the loop's
step, as the loop's own does, its caches cold; a worker of the fix that keeps a core of its own
fetches batch after batch, warm. One worker's estimate ran a mean 6.8 points under what `trainprof
try` measured over 17 benchmark runs, the measured step a median 0.88 of the worker's rate bound
and 0.95 of the probe's fetch alone; by hand a second batch straight after the first took
0.93-0.98 of it. Up to PAIRS pairs within BUDGET_S of pauses (each pause two of the worker's
fetches); fewer than MIN_PAIRS (the script ended, the worker failed: the reason is kept): no
figure. A run that goes on times another session after each later block of thread steps
(capture/threadsteps, up to its BLOCKS; `again` says when), with a worker forked anew and other
batches, its steps a span of their own; the ratios are pooled. One session is a few seconds of
this VM, whose speed moves in stretches: try_fakedata's 700-step runs timed ratios of 1.2-1.4 in
one session and 2.0-2.4 in half the pairs of another (its estimate 10.6 % against 24.7-27.2 in
the three runs beside it). The dataset's __getitem__ and collate run in the
forked worker as the fix would run them. Each batch comes back as a fix's worker hands it over
(shared memory, a file descriptor per tensor), where it is tensors, arrays and plain values in
lists, tuples and mappings (`sendable`: anything else could fail to pickle in the worker's queue,
which drops it, and the loop would wait out the timeout); once it is there, the loop's receiving
of it is timed (`received`) and the batch dropped, never given to the script. That is the
hand-over at the moments of the steps, with the loop's own process, heap and batches: the probe
after the run (capture/loaderipc) times batches of the same shapes seconds later, when this VM
can run at another speed (the Hugging Face example's loop received a batch in 1.1-1.2 ms at the
speed of a run whose probe said 1.97). The worker is idle then, as one that keeps ahead of the
loop is when it takes a batch.
Off with `worker_fetch = false` under [run] in the config.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from trainprof.capture.config import TIMED_AFTER
from trainprof.capture.state import S
from trainprof.errors import one_line

WARM = 1  # items (two batches each) the worker fetches first, untimed (imports, first faults)
# Pairs not kept after the fork: in the first step after it the loop's fetch pays copy-on-write
# faults on the pages it writes (try_fakedata: 25-31 ms against 21.5 in the later pairs)
SKIP = 1
# Steps after the worker stopped still left out of the run's statistics: the loop takes a few to
# return to its pace (try_mlp's 0.4 ms step: 1.4-1.6 ms right after, then 0.46-0.84, 0.41-0.66,
# 0.39-0.56, and 0.38-0.49 from the fifth).
SETTLE = 4
PAIRS = 12  # pairs timed at most
MIN_PAIRS = 3  # fewer pairs: no figure
BUDGET_S = 2.0  # the pauses (the worker's fetches, estimated from the loop's) stay within this
WORKER_COST = 2.0  # the worker's fetch assumed at most this many loop fetches, for the budget
TIMEOUT_S = 20.0  # a worker that hands nothing over in this long is given up
NO_ROOM = "--max-steps left no steps for it after the profiling window"  # why no worker


@dataclass(frozen=True)
class Source:
    """What the loop's loader fetches from: its map-style dataset, collate function and batch
    size (None: the dataset's items are the batches, `collate` converts them)."""

    dataset: Any
    collate: Any
    batch_size: int | None


def source_of(it: Any) -> Source | None:
    """The Source of a DataLoader iterator without workers over a map-style dataset (else None:
    workers already, an iterable dataset, or an iterator this torch does not describe)."""
    from torch.utils.data import IterableDataset

    if getattr(it, "_num_workers", None) != 0:
        return None
    dataset = getattr(it, "_dataset", None)
    collate = getattr(it, "_collate_fn", None)
    if dataset is None or collate is None or isinstance(dataset, IterableDataset):
        return None
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        return None
    size = None
    if getattr(it, "_auto_collation", False):
        size = getattr(getattr(it, "_index_sampler", None), "batch_size", None)
        if not isinstance(size, int) or size < 1:
            return None
    return Source(dataset, collate, size)


@functools.cache
def _sched_getcpu() -> Any:
    """libc's sched_getcpu, looked up once (this_cpu runs in the loop's steps); None without."""
    try:
        return ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None


def this_cpu() -> int:
    """The CPU the calling thread runs on (-1: not known)."""
    getcpu = _sched_getcpu()
    return int(getcpu()) if getcpu is not None else -1


class _TimedBatches(torch.utils.data.Dataset):
    """Item i: the wall times (s) to fetch batch 2i of the source and collate it, as a fetcher
    does (`__getitems__` where the dataset has it), and batch 2i + 1 straight after it (warm),
    with the first batch; each item after the main process releases
    `gate` (it waits meanwhile), on the CPU `cpu` names (the one the loop's step just ran on: a
    VM's vCPUs can differ in speed for seconds at a time, try_jpeg's worker measuring 1.7-1.9x
    and 0.6-0.8x the loop's fetch in stretches, 1.0-1.15x pinned)."""

    def __init__(
        self, src: Source, batches: int, gate: Any, cpu: Any, stop: Any, offset: int = 0,
        pairs: int = 0,
    ) -> None:
        self.src = src
        self.batches = batches  # items: the source holds at least twice as many batches
        # item i fetches the source's pair of batches offset + i, around again past its `pairs`
        self.offset, self.pairs = offset, max(pairs, 1)
        self.gate = gate
        self.cpu = cpu
        self.stop = stop  # set: the pairs are over, the item asked for is not fetched
        self.allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()

    def __len__(self) -> int:
        return self.batches

    def __getitem__(self, i: int) -> tuple[float, float, Any]:
        if not self.gate.acquire(timeout=TIMEOUT_S):
            raise TimeoutError("the run never let the worker fetch")
        if self.stop.value:
            return 0.0, 0.0, None
        if self.cpu.value >= 0:
            with contextlib.suppress(OSError):  # a CPU no longer allowed: wherever it is
                os.sched_setaffinity(0, {self.cpu.value})
        first = 2 * ((self.offset + i) % self.pairs)
        t0 = time.perf_counter()
        batch = self._fetch(first)
        took = time.perf_counter() - t0
        # The next batch straight after, as a fix's worker fetches batch after batch on a core
        # of its own (its caches warm), where the first came after the loop's step (cold).
        t0 = time.perf_counter()
        self._fetch(first + 1)
        warm = time.perf_counter() - t0
        # The hand-over off the loop's CPU again, as a fix's worker's: the queue's feeder thread
        # and the resource sharer's, started by this thread, would inherit the pin, and a
        # hand-shake on the loop's own CPU took 4-5 ms a batch where 1.4-2.0 on the other.
        if self.allowed:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self.allowed)
        return took, warm, batch if sendable(batch) else None

    def _fetch(self, i: int) -> Any:
        """Batch i of the source, collated as a fetcher does."""
        src = self.src
        if src.batch_size is None:
            return src.collate(src.dataset[i])
        idx = list(range(i * src.batch_size, (i + 1) * src.batch_size))
        many = getattr(src.dataset, "__getitems__", None)
        return src.collate(many(idx) if many is not None else [src.dataset[j] for j in idx])


def sendable(batch: Any, depth: int = 0) -> bool:
    """Whether a batch is tensors, arrays and plain values in lists, tuples and mappings (what
    default collates make, a BatchEncoding included), which a worker hands over as the fix's
    would. Anything else is not sent back: a batch that fails to pickle in the worker's queue
    would be dropped there, and the loop would wait for it until the timeout."""
    if depth > 8:
        return False
    if isinstance(batch, (torch.Tensor, str, bytes, int, float, bool, type(None))):
        return True
    if type(batch).__module__ == "numpy":
        return True
    if isinstance(batch, Mapping):
        return all(sendable(v, depth + 1) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return all(sendable(v, depth + 1) for v in batch)
    return False


def _why(err: BaseException) -> str:
    """The error's last line: a worker's error re-raised here ends with the original one."""
    return one_line(err, last=True, width=160)


@contextlib.contextmanager
def _unseen() -> Any:
    """trainprof's probes off: the worker's loader is not the script's (its fetches are no
    steps' fetches, it is no loader of the run's metadata)."""
    enabled, S.enabled = S.enabled, False
    try:
        yield
    finally:
        S.enabled = enabled


class WorkerPairs:
    """Times a worker's fetch between the run's steps (see the module doc). `ready()` says when
    the profiling window is saved and the thread steps are done; `wanted()`, asked once then,
    whether the run is one the estimate needs it for (a CPU run fetching in the loop);
    `last_fetch()` gives the loop's
    latest fetch, (its DataLoader iterator or None, seconds). Called at each boundary before the
    thread steps change the count, so the count then is the ended step's."""

    def __init__(
        self,
        ready: Callable[[], bool],
        wanted: Callable[[], bool],
        last_fetch: Callable[[], tuple[Any, float] | None],
        enabled: bool = True,
        steps_done: Callable[[], int] = lambda: 0,
        max_steps: int = 0,
        again: Callable[[], bool] = lambda: False,
        sessions: int = 1,
    ) -> None:
        self.ready = ready
        self.again = again  # a later session may begin (capture/threadsteps ended another block)
        self.most = sessions  # sessions at most
        self.sessions = 0  # sessions begun (a worker forked, or about to be)
        self.spans: list[tuple[int, int]] = []  # (first, stopped) of the sessions ended
        self.wanted = wanted
        self.last_fetch = last_fetch
        self.enabled = enabled
        self.steps_done = steps_done  # steps ended so far: the next step's index
        self.max_steps = max_steps  # > 0: the run ends there (--max-steps)
        self.pid = os.getpid()
        self.pairs: list[tuple[float, float]] = []  # (the loop's fetch, the worker's) in s
        self.warm: list[float] = []  # each pair's worker's next batch over its first
        self.received: list[float] = []  # the loop's receiving of each pair's batch (s)
        self.first: int | None = None  # the step whose fetch forked the worker
        self.stopped: int | None = None  # the step begun right after the worker was stopped
        self.skipped = ""  # why there are no pairs, or fewer than wanted
        self.state = "waiting"  # waiting -> forking -> running -> done
        self._it: Any = None
        self._gate: Any = None
        self._cpu: Any = None  # where the worker fetches next (a shared int)
        self._stop: Any = None  # a shared flag: the worker's pending item is not fetched
        self._src: Source | None = None
        self._wanted = 0  # pairs this session times
        self._got = 0  # pairs this session timed
        self._offset = 0  # the worker's first item: later sessions fetch other batches
        self._pairs = 0  # the source's batches, two by two
        self._timeout = TIMEOUT_S
        self._skip = 0  # pairs still to leave out (SKIP)
        self._threads = 0  # the run's intra-op threads when the worker was forked

    def after_step(self) -> None:
        """Called at every step boundary, outside the step times (capture/stepper on_step)."""
        if self.state == "done" or os.getpid() != self.pid or not S.enabled:
            return
        if self.state == "waiting":
            if not self.enabled:
                self.skipped = "worker_fetch = false in the config"
                self.state = "done"
            elif self.ready():
                self._start()
            return
        if self.state == "between":
            if self.again():
                self._start()
            return
        if self.state == "forking":
            if not self._room(self.steps_done() + 1):
                self.skipped = NO_ROOM
                self.state = "done"
            return
        if not self._room(self.steps_done() + 1):
            # No room to stop it at the next boundary: now (see _room).
            self.skipped = f"--max-steps left room for {len(self.pairs)} pair(s)"
            self.close()
            return
        if torch.get_num_threads() != self._threads:
            return  # a thread step's: its fetch is not the run's
        it, loop_s = self.last_fetch() or (None, 0.0)
        if self._src is None or getattr(it, "_dataset", None) is not self._src.dataset or (
            getattr(it, "_num_workers", None) != 0
        ):
            return  # no fetch of that dataset in the loop in this step (evaluation): no pair
        try:
            self._cpu.value = this_cpu()
            self._gate.release()  # the worker's turn; the loop waits for its batch
            # The batch handed over as the fix's workers would: the loop's side of it, timed
            # on a batch that is there (the wait is the worker's fetch, timed in the worker).
            ready = getattr(getattr(self._it, "_data_queue", None), "_poll", None)
            waited = ready(self._timeout) if ready is not None else False
            with _unseen():
                t0 = time.perf_counter()
                worker, warm, batch = next(self._it)
                received = time.perf_counter() - t0
            worker, warm = float(worker), float(warm)
            batch_sent = batch is not None
            del batch
        except Exception as err:  # noqa: BLE001 - the dataset fails in a worker: no more pairs
            self.skipped = f"the worker's fetch failed ({_why(err)})"
            self.close()
            return
        if self._skip:
            self._skip -= 1
            return
        self.pairs.append((loop_s, worker))
        self._got += 1
        if worker > 0:
            self.warm.append(warm / worker)
        if waited and batch_sent:
            self.received.append(received)
        if self._got >= self._wanted:
            self.close(complete=True)

    def _room(self, step: int) -> bool:
        """Whether the worker may be stopped at the boundary before `step` and leave, after the
        SETTLE steps left out with it, TIMED_AFTER steps under --max-steps to time the step.
        Nothing is done at a boundary that would leave no room to stop at the next one."""
        return not self.max_steps or self.max_steps - step - SETTLE >= TIMED_AFTER

    def settled(self, ended: int) -> bool:
        """Whether, with `ended` steps done, no session runs and the steps the last one disturbed
        are over (SETTLE after its worker stopped): what runs next at a boundary times the loop
        alone."""
        if self.state not in ("between", "done"):
            return False
        return self.stopped is None or ended >= self.stopped + SETTLE

    def steps(self, ended: int) -> list[int]:
        """The steps of the run's `ended` so far that the worker's fetches disturbed: in each
        session, from its fork to SETTLE steps after it stopped (RunMeta.worker_fetch_steps)."""
        spans = list(self.spans)
        if self.first is not None and self.stopped is None:
            spans.append((self.first, ended))
        out: list[int] = []
        for first, stopped in spans:
            out.extend(range(first, min(ended, stopped + SETTLE)))
        return sorted(set(out))

    def _start(self) -> None:
        self.state = "done"
        self.first = self.stopped = None
        if not self.wanted():  # a GPU run, workers already, fetches too short to matter
            self.skipped = "when the profiling window ended, no CPU loop's fetches to time"
            return
        if not self._room(self.steps_done() + 1):
            self.skipped = NO_ROOM
            return
        last = self.last_fetch()
        try:
            src = source_of(last[0]) if last is not None and last[0] is not None else None
        except Exception:  # noqa: BLE001 - an odd dataset (hasattr raising): no pairs
            src = None
        if src is None or last is None:
            self.skipped = "no map-style dataset behind the loop's batches"
            return
        if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
            self.skipped = "no fork start method here"
            return
        size = src.batch_size or 1
        try:
            batches = len(src.dataset) // size
        except Exception as err:  # noqa: BLE001 - a dataset whose __len__ fails: no figure
            self.skipped = f"the dataset's length is not known ({_why(err)})"
            return
        fetch = max(last[1], 1e-6)
        items = batches // 2 - WARM - SKIP  # two batches each, none fetched twice in a session
        self._wanted = min(PAIRS, items, int(BUDGET_S / (2 * WORKER_COST * fetch)))
        self._got = 0
        self._pairs = batches // 2  # the source's batches, two by two (later sessions go around)
        if self._wanted < MIN_PAIRS:
            self.skipped = (
                "the dataset holds too few batches" if items < MIN_PAIRS
                else f"a fetch takes {fetch:.2f} s, too long to repeat"
            )  # fmt: skip
            return
        self._src = src
        self._timeout = max(TIMEOUT_S, 20 * fetch)
        self._threads = torch.get_num_threads()  # the ended step's: the run's count
        self.state = "forking"  # at the loop's next fetch from the dataset (before_fetch)

    def before_fetch(self, it: Any) -> None:
        """Called by the loop's fetch (capture/probes), after its step boundary: the worker is
        forked here, where the loop's stack is the one a worker of the fix forks from (the loop
        calling into the DataLoader), not below the boundary's frames (the stepper's, the
        session's, this module's: five more, each costing FakeData's stack formatting)."""
        if self.state != "forking" or os.getpid() != self.pid:
            return
        src = self._src
        if src is None or getattr(it, "_dataset", None) is not src.dataset:
            return  # another loader's fetch (evaluation): the training loop's next one
        self.state = "running"
        self.sessions += 1
        self.first = self.steps_done()  # this fetch's step
        try:
            self._gate = multiprocessing.get_context("fork").Semaphore(0)
            self._cpu = multiprocessing.get_context("fork").Value("i", this_cpu(), lock=False)
            self._stop = multiprocessing.get_context("fork").Value("b", 0, lock=False)
            with _unseen():
                self._it = iter(torch.utils.data.DataLoader(
                    _TimedBatches(src, WARM + SKIP + self._wanted, self._gate, self._cpu,
                                  self._stop, self._offset, self._pairs),
                    batch_size=None,
                    num_workers=1, prefetch_factor=1, multiprocessing_context="fork",
                    timeout=self._timeout,
                ))  # fmt: skip
                for _ in range(WARM):
                    self._gate.release()
                    next(self._it)
        except Exception as err:  # noqa: BLE001 - no worker here (a sandbox, /dev/shm full)
            self.skipped = f"the worker's fetch failed ({_why(err)})"
            self.close()
            return
        self._skip = SKIP
        self._offset += WARM + SKIP + self._wanted

    def close(self, complete: bool = False) -> None:
        """Stop the worker (the session's pairs are done, `complete`; or the script ended during
        them, or they cannot go on). A complete session leaves room for another (`again`)."""
        if self.first is not None and self.stopped is None:  # (a fork that failed: stopped too)
            self.stopped = self.steps_done()
            self.spans.append((self.first, self.stopped))
        it, self._it = self._it, None
        if self._stop is not None and self._gate is not None:
            # The worker waits at the gate for the item it prefetched: let it through, unfetched.
            # Left waiting, it missed torch's word to stop, and the shutdown waited out its 5 s
            # join timeout (each close after a process's first, in the tests).
            self._stop.value = 1
            self._gate.release()
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            try:
                shutdown()
            except Exception:  # noqa: BLE001,S110 - a worker already gone
                pass
        self._src = None
        self.state = "between" if complete and self.sessions < self.most else "done"

    def figures(self) -> tuple[float | None, float | None, int, str]:
        """(the worker's median fetch in s, the median ratio to the loop's, pairs, why none)."""
        ratios = self.ratios()
        if len(ratios) < MIN_PAIRS:
            why = self.skipped or (
                f"{len(ratios)} fetch pair(s) before the run ended" if self.state != "waiting"
                else "the run ended before the worker's fetch was timed"
            )  # fmt: skip
            return None, None, len(ratios), why
        worker = statistics.median(w for _, w in self.pairs)
        return worker, statistics.median(ratios), len(ratios), ""

    def ratios(self) -> list[float]:
        """Each pair's worker fetch over the loop's (what `figures` takes the median of)."""
        return [w / m for m, w in self.pairs if m > 0]

    def warm_ratio(self) -> float | None:
        """The median of each pair's worker's next batch, fetched straight after, over its first
        (None with fewer than MIN_PAIRS)."""
        return statistics.median(self.warm) if len(self.warm) >= MIN_PAIRS else None
