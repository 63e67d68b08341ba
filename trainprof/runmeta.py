"""Run metadata (`trainprof.json`): written by capture, read by analysis, compare and reports.

Kept free of torch so that `diagnose` and `compare` can read it anywhere.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import msgspec

from trainprof.fileio import write_atomic

SCHEMA = 1
META_NAME = "trainprof.json"
MAX_ITERS_KEPT = 64  # DataLoaderInfo.iter_steps and .left_early keep no more
MAX_WORKER_BATCHES = 400  # DataLoaderInfo.worker_batch_ms kept
TRY_NAME = "try.json"  # `trainprof try`'s results, written into the run folder
EARLIER_TRY = re.compile(r"try\.(\d+)\.json")  # an earlier try's results, kept beside it
# Variables torchrun sets in each rank for that job only (its run id, an error file of that
# job's): not the script's environment, neither recorded nor replayed by `trainprof try`.
LAUNCHER_ENV = ("TORCHELASTIC_",)


def started_by_torchrun(env: Mapping[str, str]) -> bool:
    """Whether a process with this environment is a rank that torchrun's agent started."""
    return "TORCHELASTIC_RUN_ID" in env


def is_try_file(name: str) -> bool:
    """try.json, or an earlier `trainprof try`'s results kept beside it (try.N.json)."""
    return name == TRY_NAME or EARLIER_TRY.fullmatch(name) is not None


def earlier_tries(folder: Path) -> list[str]:
    """The names of the earlier tries' results kept in `folder`, oldest first."""
    return [name for _, name in _earlier(folder)]


def _earlier(folder: Path) -> list[tuple[int, str]]:
    found = (EARLIER_TRY.fullmatch(p.name) for p in Path(folder).glob("try.*.json"))
    return sorted((int(m.group(1)), m.group(0)) for m in found if m)


def keep_earlier_try(folder: Path) -> Path | None:
    """Move the folder's try.json, an earlier `trainprof try`'s results, to try.N.json (N one
    past the highest there), so that a new try never overwrites what one measured: tries of
    other fixes, or of the same ones at another time. The new path; None where there was none."""
    folder = Path(folder)
    current = folder / TRY_NAME
    if not current.is_file():
        return None
    n = 1 + max((k for k, _ in _earlier(folder)), default=0)
    kept = folder / f"try.{n}.json"
    os.replace(current, kept)
    return kept


class DataLoaderInfo(msgspec.Struct, kw_only=True):
    """One DataLoader: one object, however many epochs iterate it; loaders built again by the
    same constructor call with the same settings (a new one every epoch) are one entry too."""

    num_workers: int = 0
    pin_memory: bool = False
    batch_size: int | None = None
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    dataset: str = ""
    location: str | None = None  # file:line of the constructor call in user code
    instances: int = 1  # objects built by this constructor call with these settings
    iterators: int = 0  # iterators made over it (epochs, usually), all instances together
    # The training steps done when each iterator was made (the first MAX_ITERS_KEPT), and for
    # each iterator that a newer one replaced before its end, the batches it still had (-1: its
    # length unknown). An evaluation loader cut short each pass (Lightning's
    # limit_val_batches) leaves its workers' prefetched batches unused (analysis/loader_cuts).
    iter_steps: list[int] = []
    left_early: list[int] = []
    # Iterators made with autograd off (torch.no_grad, inference_mode): an evaluation's, as
    # Lightning's validation loop and a plain `with torch.no_grad(): for x in val:` make them.
    grad_off_iters: int = 0
    # An IterableDataset: each worker runs its whole __iter__. `worker_split`: how its code is
    # seen to split the stream between workers ("get_worker_info", "worker_init_fn",
    # "datapipe"; "": not seen to, so every worker would yield every sample); `num_shards`: a
    # Hugging Face streaming dataset's shards, the most workers that get any
    # (capture/iterable_split).
    iterable: bool = False
    worker_split: str = ""
    num_shards: int | None = None
    # With 2 or more workers over an iterable dataset: the first batches of its first iterator
    # digested, and how many were copies of one before them (capture/repeats): a stream every
    # worker yields whole comes num_workers times.
    checked_batches: int = 0
    repeated_batches: int = 0
    # A loader with workers: the wall time (ms) each batch took to fetch in a worker, the
    # first MAX_WORKER_BATCHES over its workers, worker by worker (capture/workerbatches; a
    # worker waiting for a core included, the hand-over to the loop not): the workers' rate.
    worker_batch_ms: list[float] = []


class OptimizerInfo(msgspec.Struct, kw_only=True):
    cls: str = msgspec.field(name="class", default="")
    foreach: bool | None = None
    fused: bool | None = None
    location: str | None = None


class MetricInfo(msgspec.Struct, kw_only=True):
    cls: str = msgspec.field(name="class", default="")
    nan_strategy: str | None = None
    device: str | None = None
    location: str | None = None


class Flags(msgspec.Struct, kw_only=True):
    cudnn_benchmark: bool | None = None
    cuda_matmul_allow_tf32: bool | None = None
    cudnn_allow_tf32: bool | None = None
    float32_matmul_precision: str | None = None
    autocast_used: bool = False
    grad_scaler_used: bool = False
    compile_used: bool = False


class Window(msgspec.Struct, kw_only=True):
    wait: int = 0
    warmup: int = 0
    active: int = 0
    repeat: int = 1
    recorded_steps: list[int] = []  # step numbers that ended inside an active window
    # The ProfilerStep#N still open when the script ended: it is in the trace but runs to the end
    # of the script (teardown included), so it is not a full step. None when not recorded.
    partial_step: int | None = None


class SyncWarning(msgspec.Struct, kw_only=True):
    """A CUDA sync-debug warning (`--sync-debug`), aggregated by user-code location."""

    message: str = ""
    location: str | None = None
    count: int = 0


class CpuBf16(msgspec.Struct, kw_only=True):
    """bf16 autocast vs fp32 speed on the run's CPU, measured after the script (capture/cpumath)."""

    isa: str = ""  # AMX-BF16 | AVX512-BF16
    conv_speedup: float = 1.0  # forward + backward, bf16 channels-last vs fp32 NCHW
    matmul_speedup: float = 1.0  # (both at the largest size of the curves below)
    # [forward FLOPs, speed-up, fp32 µs of forward + backward on one thread] at several sizes,
    # smallest first (empty in metadata written before trainprof measured curves: then the one
    # speed-up above stands for every size; the µs are missing in older curves).
    conv_curve: list[list[float]] = []
    matmul_curve: list[list[float]] = []
    # A CNN's other layers (BatchNorm2d, ReLU, MaxPool2d), which the fix also makes bf16
    # channels-last: trace operator name -> [input elements, speed-up] (fp32 NCHW / bf16
    # channels-last), smallest first; empty without convs or in older metadata.
    eltwise_curves: dict[str, list[list[float]]] = {}
    # The model itself (capture/modelprobe): one forward + backward of a copy of the root module
    # on its last training batch, ms of CPU time on one thread, fp32 as the script ran it and
    # under the fix `trainprof try --fix cpu-bf16` applies; None when not measured (older
    # metadata, or skipped: `model_skipped` says why, and the curves above stand in).
    model: str = ""  # the root module's class name
    model_fp32_ms: float | None = None
    model_bf16_ms: float | None = None
    model_reps: int = 0  # interleaved timed runs of each (the least taken)
    model_channels_last: bool = False  # the fix made it channels-last too (a CNN)
    # A CNN not channels-last already, timed under bf16 in its own layout too (the fix's other
    # layout; analysis/bf16_layout takes the faster): one thread, and at the script's threads
    # beside the pair below. None: not timed (not a CNN, older metadata).
    model_bf16_own_layout_ms: float | None = None
    model_skipped: str = ""
    # The same pair at the script's intra-op thread count, wall time, when it was over one (None
    # otherwise and in older metadata): what the rule uses when present.
    model_threads: int = 1
    model_fp32_threads_ms: float | None = None
    model_bf16_threads_ms: float | None = None
    model_bf16_own_layout_threads_ms: float | None = None
    # The least of a fixed piece of work timed between the pairs above (ms; capture/phaseref,
    # None: not timed): their speed, against RunMeta.phase_ref_s at the run's steps.
    model_phase_ref_ms: float | None = None


class LoaderIpc(msgspec.Struct, kw_only=True):
    """A DataLoader worker's costs on the run's machine, for batches like the script's, measured
    after the script (capture/loaderipc): what `dataloader-starvation` adds back on a CPU run."""

    startup_ms: float = 0.0  # iter() to the first batch with one worker
    worker_ms: float = 0.0  # per batch, the worker's hand-over (shared memory, pickling)
    receive_ms: float = 0.0  # per batch, the main process's receiving of a waiting batch
    # The same with `busy_workers` workers fetching the next batches meanwhile (CPU work sized
    # like the run's fetch) and the loop computing between receives (None: not measured): a
    # busy worker answers the per-tensor hand-shake late. What the CPU estimate uses.
    receive_busy_ms: float | None = None
    receive_busy_all_ms: list[float] = []  # each batch's, receive_busy_ms their median
    busy_workers: int = 0
    # The loop's receiving of the script's own batches from the worker of capture/loaderfetch,
    # between the run's steps (the loop waits out the worker's fetch, then receives one that is
    # there), ms each; and the same timed after the run on batches like them, each after a wait
    # as long as the run's fetch (None: not measured). Their ratio is the machine's speed for a
    # hand-over during the steps over after them.
    receive_run_all_ms: list[float] = []
    receive_waited_ms: float | None = None
    tensors: int = 0  # tensors per batch
    batch_bytes: int = 0
    # A DataLoader worker forked from the loop fetching the script's own batches between its
    # steps, each against the loop's fetch just before (capture/loaderfetch): the worker's wall
    # ms per batch and its ratio to the loop's, medians over `worker_fetch_batches` pairs (None:
    # not measured, why in `worker_fetch_skipped`). A worker can spend more than the loop.
    worker_fetch_ms: float | None = None
    worker_fetch_ratio: float | None = None
    worker_fetch_ratio_all: list[float] = []  # each pair's, worker_fetch_ratio their median
    worker_fetch_batches: int = 0
    worker_fetch_skipped: str = ""
    # The same worker's next batch, fetched straight after each timed one, over it (median, and
    # each pair's): a worker fetching batch after batch on a core of its own, caches warm, where
    # the timed batch came after the loop's step (None: not measured; older metadata).
    worker_fetch_warm_ratio: float | None = None
    worker_fetch_warm_all: list[float] = []
    # One fp32 forward + backward of a copy of the model at intra-op thread counts, wall ms
    # (capture/modelprobe.thread_times): [[threads, ms], ...], the run's own count among them;
    # empty: not measured (`model_threads_skipped` says why).
    model_threads_ms: list[list[float]] = []
    model_threads_skipped: str = ""


class OptimizerProbe(msgspec.Struct, kw_only=True):
    """One optimizer class's step() that ran torch's single-tensor loop, timed after the script
    on copies of its parameters (capture/optprobe): the loop vs what `trainprof try --fix
    optimizer-foreach` applies, what `optimizer-foreach` reads on a CPU run."""

    loop_ms: float | None = None  # step() with foreach=False, fused=False (as the script ran it)
    fix_ms: float | None = None  # step() with the fix; both ms of this thread's CPU time
    fix: str = ""  # fused | foreach: what the fix was (fused where the class and params allow)
    # fused step() with the 4-D parameters channels-last, as cpu-bf16's fix makes a CNN's (None:
    # no 4-D parameters in the default layout, or not fused); ms of CPU time like fix_ms
    fix_channels_last_ms: float | None = None
    reps: int = 0  # interleaved timed steps of each after a warm-up step (the least taken)
    threads: int = 0  # torch intra-op threads the steps ran with (the script's, at its end)
    tensors: int = 0  # parameter tensors
    elements: int = 0  # their elements
    skipped: str = ""  # why there are no times (empty when there are)


class CompileEvent(msgspec.Struct, kw_only=True):
    """One frame Dynamo compiled (capture/dynamo.py), in the order they happened."""

    compile_id: str = ""  # Dynamo's "F/C": frame F, its C-th compile (C >= 1: a recompile)
    recompile: bool = False
    step: int | None = None  # the step it happened in, numbered from 0 like ProfilerStep#N
    location: str | None = None  # file:line of the user call that entered the compiled code
    function: str = ""  # the compiled frame: "name (file:first line)"
    reason: str | None = None  # recompiles: the guard that failed, as Dynamo words it
    graph_breaks: int = 0  # graph breaks hit while compiling it
    break_reasons: list[str] = []  # their first lines (at most 5)
    duration_s: float = 0.0  # compile time
    failed: str | None = None  # exception type when the compile failed


class DynamoInfo(msgspec.Struct, kw_only=True):
    """torch.compile over the whole run, not only the profiled window."""

    compiles: int = 0  # frames compiled, first compiles and recompiles
    recompiles: int = 0
    graph_breaks: int = 0
    events: list[CompileEvent] = []  # the first 200 compiles
    events_dropped: int = 0  # compiles past those 200 (counted above, not listed)


class Load(msgspec.Struct, kw_only=True):
    """How busy the machine was while the script ran (capture/loadprobe.py), so that `compare`
    can tell when two runs did not see the same machine. None: could not be read here."""

    interval_s: float = 0.0  # from the start of the script to the end of the capture
    loadavg_start: float | None = None  # 1-minute load average (this run's threads included)
    loadavg_end: float | None = None
    # Average number of CPUs kept busy over the interval by other processes: the machine's busy
    # time (/proc/stat) minus this process tree's CPU time (DataLoader workers included; for a
    # rank, its job's ranks on this machine and theirs: own_tree).
    other_cpus: float | None = None
    own_cpus: float | None = None  # the same for this process tree (a rank's: its job's)
    # What own_cpus counts: "process", this process and its descendants (one process, or the
    # job's top process, which started its ranks); "job", the tree of the process above that
    # holds the job's ranks on this machine (torchrun's agent, or the process that started the
    # ranks). None: recorded before 2026-11-29, when only torchrun's ranks counted their job.
    own_tree: str | None = None
    steal_cpus: float | None = None  # CPU time the hypervisor gave to other virtual machines

    def steal_share(self) -> float | None:
        """The share (0-1) of the CPU time this machine's busy CPUs wanted that the hypervisor
        gave to other virtual machines (steal: a vCPU ready to run, held by the host); None
        where not recorded or nothing ran."""
        if self.steal_cpus is None or self.other_cpus is None or self.own_cpus is None:
            return None
        wanted = self.own_cpus + self.other_cpus + self.steal_cpus
        return self.steal_cpus / wanted if wanted > 0 else None


# Two runs saw the machine differently loaded (`compare`, `try`) when the CPUs other processes
# kept busy (Load.other_cpus) are apart by more than max(0.5, 10 % of the CPUs): half a core
# taken by another job slows a two-thread loop, and a fused kernel that splits its work across
# the intra-op threads more than the single-thread code it replaces (an optimizer probe ran fused
# Adam at 0.72x the loop with 0.56 CPUs busy elsewhere, 0.48-0.61x on the quiet machine).
OTHER_CPUS_DIFF, OTHER_CPUS_SHARE = 0.5, 0.10


def other_load_differs(a: float, b: float, cpus: int) -> bool:
    """Other processes' busy CPUs `a` and `b` (Load.other_cpus) of two runs on `cpus` CPUs are
    far enough apart that the runs did not see the same machine."""
    return abs(a - b) > max(OTHER_CPUS_DIFF, OTHER_CPUS_SHARE * cpus)


# A run's steal (Load.steal_share) worth a note from this share on, and two runs' steal apart by
# more than it: the host's other guests. A `trainprof run` of try_fakedata (a 43-48 ms step on
# this 2-vCPU VM) with 28 % of its CPU time stolen took 146 ms a step, a fixed piece of work
# timed between its steps (capture/phaseref) only 1.17x as long as its typical time there, and
# its one-worker estimate came out at +38 % where `trainprof try` measured +3 % at 73 ms a step;
# four runs that hour stole 0.2-3 %. Of 112 runs kept from stops 48-54's benchmarks on this VM,
# 3 stole 10 % or more (11-28 %), the 95th percentile 1.8 %.
STEAL_SHARE = 0.10


def steal_differs(a: float, b: float) -> bool:
    """Two runs' steal shares (Load.steal_share) are far enough apart that the runs did not see
    the same host."""
    return abs(a - b) > STEAL_SHARE


class RunMeta(msgspec.Struct, kw_only=True):
    schema: int = SCHEMA
    trainprof_version: str = ""
    torch_version: str = ""
    cuda_version: str | None = None
    devices: list[str] = []  # accelerator names; empty on CPU
    cpu_count: int | None = None  # the CPUs this process may use: affinity, capped by the quota
    cpu_quota: float | None = None  # the cgroup's CPU limit (a container's --cpus); None: none
    cpus_online: int | None = None  # the machine's
    cpu_model: str = ""  # e.g. "AMD EPYC 7B13"; empty when unknown
    torch_threads: int | None = None
    load: Load | None = None  # None in metadata written before trainprof recorded it
    script: str = ""
    argv: list[str] = []  # re-runs it with python: [script, *args] or ["-m", module, *args]
    exit_code: int = 0
    status: str = "ok"  # ok | error | interrupted | incomplete
    wall_time_s: float = 0.0
    step_source: str = "none"  # optimizer | backward | dataloader | none
    step_times_s: list[float] = []  # wall time of EVERY step, not only the traced ones
    # `trainprof run --max-steps N`: the run ended the script after N steps (0: it ran to its own
    # end, or older metadata)
    max_steps: int = 0
    # On CUDA: the GPU's time per step (same indices), from an event at every step boundary
    # (capture/gpusteps.py); null where unknown (the first step, steps in a CUDA graph capture).
    gpu_step_times_s: list[float | None] = []
    # The part of each step (same indices) spent in DataLoader fetches on the script's thread,
    # and in each optimizer class's step() (classes given a closure left out): outside the
    # profiler window, these costs without the profiler. Empty in older metadata.
    fetch_times_s: list[float] = []
    optimizer_times_s: dict[str, list[float]] = {}
    # The part of each step (same indices) the script's thread spent inside the host reads
    # trainprof wraps (`.item()`, `if tensor:`, `.tolist()`, `.cpu()`, `.numpy()` by user code,
    # or of a non-CPU tensor by a library; not in DataLoader fetches): on a GPU, outside the
    # profiler window, the host's wait for the GPU in them without the profiler. Empty in older
    # metadata.
    sync_times_s: list[float] = []
    # The part of each step (same indices) the script's thread spent in `.to()` / `.cuda()`
    # copying a CPU tensor onto a device (not in DataLoader fetches): on a GPU, outside the
    # profiler window, the host's time blocked in those copies without the profiler (from
    # pageable memory they return once staged, with non_blocking=False after a stream sync).
    # Empty in older metadata.
    copy_times_s: list[float] = []
    window: Window = msgspec.field(default_factory=Window)
    # Steps (indices into step_times_s) that held an evaluation pass (Lightning validation, HF
    # Trainer.evaluate, a model.eval() forward without grad): not training, left out of statistics.
    eval_steps: list[int] = []
    eval_kinds: list[str] = []  # what evaluated, e.g. "Lightning validation"
    # [step, intra-op threads] of the steps a CPU run fetching without workers ran round-robin
    # with the thread counts a DataLoader fix would leave, after the profiling window
    # (capture/threadsteps; the first is the run's count): those with another count are left
    # out of the statistics (altered_steps). Empty otherwise and in older metadata.
    thread_steps: list[list[int]] = []
    # Steps run while a DataLoader worker forked in the loop's fetch timed its fetches of the
    # script's batches at step boundaries (capture/loaderfetch: from the step whose fetch forked
    # it to a few steps after it stopped; once per session, a long run's later ones too). The
    # loop's steps are slower then (try_mlp: 0.45-0.55 ms against 0.36-0.40 after and without
    # them): left out of the statistics (altered_steps).
    # Empty otherwise and in older metadata.
    worker_fetch_steps: list[int] = []
    # A job's rank: the steps in which another rank ran trainprof's probes (its thread steps,
    # its worker's timed fetches) and this one did not. Ranks that wait for each other at every
    # step wait through those too (accelerate's two CPU ranks: 8-15 ms steps on the rank beside
    # the pauses, 3-7 ms on the rank that paused): left out of the statistics (altered_steps).
    # Set when the job is diagnosed (ranks.lockstep_metas), not recorded.
    peer_probe_steps: list[int] = []
    # [step, seconds] of a fixed piece of work timed at the boundary after that step, from the
    # profiling window's end, on CPU runs (capture/phaseref): how fast the machine ran then, for
    # the estimates that combine the run's steps with after-run probes (analysis/phase). Empty
    # otherwise and in older metadata.
    phase_ref_s: list[list[float]] = []
    dataloaders: list[DataLoaderInfo] = []
    optimizers: list[OptimizerInfo] = []
    metrics: list[MetricInfo] = []
    flags: Flags = msgspec.field(default_factory=Flags)
    traces: list[str] = []  # trace file names, relative to the run folder
    rank: int | None = None
    world_size: int | None = None
    # The job's ranks on this machine, which share its cores: torchrun's and accelerate's
    # LOCAL_WORLD_SIZE, else every rank where the rendezvous (MASTER_ADDR) is this machine's
    # loopback address (Lightning's ddp, torch.multiprocessing.spawn); None where not known.
    local_world_size: int | None = None
    module: str | None = None  # set when run with -m MODULE (script is then the module's file)
    python_version: str = ""
    started_at: str = ""  # local time, ISO 8601
    notes: list[str] = []  # one-line remarks on the capture, e.g. "window incomplete: ..."
    sync_warnings: list[SyncWarning] = []
    cupti_teardown: bool = False  # trainprof set TEARDOWN_CUPTI=1 (capture/cudaflags)
    cpu_bf16: CpuBf16 | None = None  # only for CPU-only runs without autocast on bf16 hardware
    loader_ipc: LoaderIpc | None = None  # only for CPU-only runs fetching without workers
    # CPU-only runs: per optimizer class that ran the single-tensor loop (named as in
    # optimizer_times_s), its step() timed after the script. Empty otherwise and in older metadata.
    optimizer_probe: dict[str, OptimizerProbe] = {}
    # Trace files the script's own profiler wrote (absolute paths; trainprof's stepped aside).
    user_traces: list[str] = []
    # The user's source files as the run ran them (capture/sources): absolute path -> the copy's
    # name, relative to the run folder. Empty in older metadata.
    sources: dict[str, str] = {}
    dynamo: DynamoInfo | None = None  # only when the script called torch.compile
    # What `trainprof try` needs to run the script again as it ran here: the working folder at
    # the start, the Python that ran it, and the environment variables that change a training
    # run (threads, allocators, CUDA, frameworks; nothing named like a secret).
    cwd: str = ""
    executable: str = ""
    env: dict[str, str] = {}
    # The process was a rank that torchrun started (`trainprof run --nproc-per-node`, torchrun
    # -m trainprof.capture.worker): its rounds start through torchrun too (a script that reads
    # its rank from torchrun's variables fails without them, even as the one rank of a job).
    torchrun: bool = False

    def script_trace(self) -> str | None:
        """The script's own latest trace where it stands for trainprof's: the script's profiler
        cut trainprof's window short or started before it (capture/userprof), and the file is
        still there; else None."""
        w = self.window
        if not self.user_traces or (w.recorded_steps and w.partial_step is None):
            return None
        there = [p for p in self.user_traces if os.path.isfile(p)]
        return there[-1] if there else None

    def machine_cpus(self) -> int:
        """The machine's CPUs (those this process may use where that is all that is known)."""
        return self.cpus_online or self.cpu_count or 1

    def cpus_per_rank(self) -> int | None:
        """The CPUs this process's DataLoader workers and intra-op threads can count on: its
        `cpu_count`, shared with the job's other ranks on this machine (`local_world_size`)
        where this process may use all of them (a launcher that binds each rank to CPUs of its
        own leaves `cpu_count` that rank's already); None where `cpu_count` is not known."""
        if not self.cpu_count:
            return None
        local = self.local_world_size or 1
        if local > 1 and (self.cpus_online is None or self.cpu_count >= self.cpus_online):
            return max(1, self.cpu_count // local)
        return self.cpu_count

    def altered_steps(self) -> set[int]:
        """Steps that are no plain training steps of the run: evaluation passes, steps run with
        another intra-op thread count than the run's (thread_steps), and steps run while a
        DataLoader worker timed its fetches (worker_fetch_steps), here or, in a job, on another
        rank (peer_probe_steps)."""
        return (set(self.eval_steps) | self.fewer_thread_steps() | set(self.worker_fetch_steps)
                | set(self.peer_probe_steps))

    def fewer_thread_steps(self) -> set[int]:
        """The steps of `thread_steps` run with another count than the run's."""
        run = self.thread_steps[0][1] if self.thread_steps else 0  # the block starts with it
        return {s for s, t in self.thread_steps if t != run}

    def probe_steps(self) -> tuple[set[int], set[int]]:
        """The altered steps that time a DataLoader fix, each counted once: (run with fewer
        threads, while a worker timed its fetches and not one of those); evaluation passes
        left out of both."""
        evals = set(self.eval_steps)
        fewer = self.fewer_thread_steps() - evals
        return fewer, set(self.worker_fetch_steps) - evals - fewer


# The first note of a trainprof.json written while the script still ran (capture/session.py):
# one left like that means trainprof's process ended without saving (os._exit, SIGKILL, OOM).
UNFINISHED = "the run had not ended when this was written"


def unfinished(meta: RunMeta) -> bool:
    """The metadata was written while the run went on, and never replaced by the final one."""
    return bool(meta.notes) and meta.notes[0].startswith(UNFINISHED)


def write_meta(meta: RunMeta, folder: Path, name: str = META_NAME) -> Path:
    """Write the metadata whole or not at all (OSError when it cannot be written)."""
    return write_atomic(
        Path(folder) / name, msgspec.json.format(msgspec.json.encode(meta), indent=2)
    )


def read_meta(path: Path) -> RunMeta | None:
    """Metadata from a run folder or a metadata file; None when there is none."""
    path = Path(path)
    if path.is_dir():
        path = path / META_NAME
    if not path.is_file():
        return None
    try:
        return msgspec.json.decode(path.read_bytes(), type=RunMeta)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
