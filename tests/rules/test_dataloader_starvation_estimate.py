"""dataloader-starvation's CPU estimate: the fetch and step without the profiler (from the run's
unprofiled steps), the cost of handing batches between processes, cores shared between workers
and the model's threads; and a severity that follows from figures, not from the traced steps'
stalls.

The trace is a real CPU loop recorded here; the step times, fetch times and worker costs are given
in the metadata, so the expected figures follow from them, whatever the machine. No timing
asserts.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from cpu_trace import record, with_meta

from trainprof.analysis.loader_workers import (
    eval_ahead,
    fixed_step,
    step_threads,
    step_with,
    thread_scale,
)
from trainprof.diagnose import diagnose_path
from trainprof.runmeta import DataLoaderInfo, LoaderIpc, RunMeta
from trainprof.tryfix.estimates import MODEL, SUM, estimates

# A Python-heavy fetch (per-sample __getitem__ building tensors), num_workers=0.
LOOP = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        x = torch.zeros(16)
        for k in range(16):
            x[k] = float((i * k) % 7)
        return x, i % 4

torch.manual_seed(0)
model = nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
it = iter(DataLoader(Slow(), batch_size=16))

def step(i):
    x, y = next(it)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""


@pytest.fixture(scope="module")
def loop(tmp_path_factory) -> Path:
    return record(tmp_path_factory.mktemp("loop"), LOOP, steps=4)


def _meta(step_ms: list[float], fetch_ms: list[float], ipc: LoaderIpc | None) -> RunMeta:
    return RunMeta(
        cpu_count=2, torch_threads=2, loader_ipc=ipc,
        dataloaders=[DataLoaderInfo(num_workers=0, batch_size=16)],
        step_times_s=[t / 1000 for t in step_ms], fetch_times_s=[t / 1000 for t in fetch_ms],
    )  # fmt: skip


def _starvation(folder: Path):
    (d,) = diagnose_path(folder)
    (f,) = [f for f in d.findings if f.rule == "dataloader-starvation"]
    return f


def test_fixed_step_model():
    # A fetch as long as the compute, nothing to hand over: one worker overlaps them, except
    # that the two share two cores with the model's one thread.
    assert fixed_step(m=10.0, f=10.0, k=1, r=0.0, w=0.0, cores=2, n=1) == 10.0
    # Handing over costs the loop `r` per batch and the worker `w`.
    assert fixed_step(m=10.0, f=10.0, k=1, r=2.0, w=3.0, cores=2, n=1) == 13.0
    # Too few cores: all the CPU work spread over them bounds the step.
    assert fixed_step(m=10.0, f=30.0, k=1, r=0.0, w=0.0, cores=2, n=2) == 20.0
    # A tiny fetch: the hand-over costs more than it saves (try_mlp: 0.2 ms fetch, 1.3 ms receive).
    assert fixed_step(m=0.5, f=0.2, k=1, r=1.3, w=3.5, cores=2, n=1) > 0.7
    # Receiving counts on the loop's path and on the cores: (10 + 30 + 4) / 2.
    assert fixed_step(m=10.0, f=30.0, k=1, r=4.0, w=0.0, cores=2, n=2) == 22.0
    assert fixed_step(m=20.0, f=10.0, k=1, r=4.0, w=0.0, cores=2, n=2) == 24.0
    # A worker fetches batch after batch, warm: its rate bound at the warm ratio (0.9 x 20 + 2 =
    # 20), and its work on the cores too, where the workers share them with the model's
    # threads (n = cores): (10 + 0.5 x 30 + 4) / 2, not (10 + 30 + 4) / 2 as above.
    assert fixed_step(m=10.0, f=20.0, k=1, r=0.0, w=2.0, cores=2, n=1) == 22.0
    assert fixed_step(m=10.0, f=20.0, k=1, r=0.0, w=2.0, cores=2, n=1, warm=0.9) == 20.0
    assert fixed_step(m=10.0, f=30.0, k=1, r=4.0, w=0.0, cores=2, n=2, warm=0.5) == 14.5
    # The receiving from busy workers counts on the cores where the workers fill them: (10 + 30
    # + 8) / 2 = 24 with two workers on two cores. With one (a core for each process) the cores
    # take the loop's own receiving, as its path does: the loop's path 14 + 2 = 16 bounds the
    # step, where the busy figure on the cores would say (14 + 12 + 8) / 2 = 17.
    assert fixed_step(m=10.0, f=30.0, k=1, r=2.0, w=0.0, cores=2, n=2, r_busy=8.0) == 24.0
    assert fixed_step(m=14.0, f=12.0, k=1, r=2.0, w=0.0, cores=2, n=1, r_busy=8.0) == 16.0


def test_the_unprofiled_fetch_is_what_counts(loop: Path, tmp_path: Path):
    """The profiler inflates a Python-heavy fetch (136 ms profiled vs 33 ms unprofiled in one
    run): the estimate uses the fetch time measured in the run's unprofiled steps."""
    steps = [20.0] * 30
    ipc = LoaderIpc(receive_ms=0.5, worker_ms=1.0, startup_ms=50.0, tensors=2)
    few = _starvation(with_meta(loop, tmp_path / "few", _meta(steps, [2.0] * 30, ipc)))
    many = _starvation(with_meta(loop, tmp_path / "many", _meta(steps, [10.0] * 30, ipc)))
    assert few.metrics["unprofiled_fetch_ms"] == pytest.approx(2.0)
    assert many.metrics["unprofiled_fetch_ms"] == pytest.approx(10.0)
    # M = 10, F = 10, R = 0.5, W = 1 ms on 2 cores: one worker (one thread) makes the step
    # max(M + R, F + W, (M + F + W + R) / 2) = 11 ms, two workers bring the workers' part to
    # (F + W) / 2 and leave the cores as the bound: 10.75 ms, from 20 ms.
    assert many.metrics["suggested_num_workers"] == 2
    assert many.metrics["fixed_step_ms"] == pytest.approx(10.75)
    assert many.est_saving_pct == pytest.approx(100 * (20 - 10.75) / 20, abs=0.05)
    assert few.est_saving_pct < many.est_saving_pct
    assert "torch.set_num_threads(1)" in many.fix


def test_tiny_samples_workers_do_not_pay_off(loop: Path, tmp_path: Path):
    """try_mlp: a 0.2 ms fetch in a 0.8 ms step, 1.3 ms to receive a batch from a worker."""
    ipc = LoaderIpc(receive_ms=1.3, worker_ms=3.5, startup_ms=67.0, tensors=2)
    f = _starvation(with_meta(loop, tmp_path, _meta([0.8] * 30, [0.2] * 30, ipc)))
    assert f.est_saving_pct == 0 and f.severity == "info"
    assert "would not pay off" in f.title and "num_workers=0" in f.fix


def test_severity_from_the_unprofiled_medians(loop: Path, tmp_path: Path):
    """Two runs of one script: the traced steps are the same, the unprofiled steps differ by
    stalls in a few of them (a busy machine). The medians, hence the estimate and its
    severity, do not move; the old model took the fetch's share from the traced steps."""
    ipc = LoaderIpc(receive_ms=0.5, worker_ms=1.0, tensors=2)
    calm = _meta([20.0] * 30, [6.0] * 30, ipc)
    stalled = [200.0 if i % 5 == 0 else 20.0 for i in range(30)]  # 6 steps of 30 stalled
    busy = _meta(stalled, [6.0] * 30, ipc)
    a = _starvation(with_meta(loop, tmp_path / "a", calm))
    b = _starvation(with_meta(loop, tmp_path / "b", busy))
    assert (a.severity, a.est_saving_pct) == (b.severity, b.est_saving_pct)
    assert a.severity == "high"


def test_the_receiving_with_busy_workers_is_what_counts(loop: Path, tmp_path: Path):
    """A worker busy fetching answers the per-tensor hand-shake late (try_fakedata with 2
    workers: 4.1 ms per batch in the loop, 1.2 ms from the probe's idle worker): the model takes
    the probe's figure with busy workers where it has one, the idle one otherwise."""
    steps, fetch = [20.0] * 30, [10.0] * 30
    idle = LoaderIpc(receive_ms=0.5, worker_ms=1.0, tensors=2)
    busy = LoaderIpc(receive_ms=0.5, receive_busy_ms=4.0, busy_workers=2, worker_ms=1.0, tensors=2)
    a = _starvation(with_meta(loop, tmp_path / "idle", _meta(steps, fetch, idle)))
    b = _starvation(with_meta(loop, tmp_path / "busy", _meta(steps, fetch, busy)))
    assert a.metrics["receive_ms_per_batch"] == pytest.approx(0.5)
    assert b.metrics["receive_ms_per_batch"] == pytest.approx(4.0)
    # M = 10, F = 10, W = 1 on 2 cores: with R = 4 the loop's own path M + R = 14 ms bounds the
    # step (whichever worker count); with R = 0.5 the cores do, 10.75 ms.
    assert a.metrics["fixed_step_ms"] == pytest.approx(10.75)
    assert b.metrics["fixed_step_ms"] == pytest.approx(14.0)
    assert b.est_saving_pct == pytest.approx(100 * (20 - 14) / 20, abs=0.05)
    assert "while 2 worker(s) fetch the next ones" in b.evidence
    assert "while" not in a.evidence.split("to receive it")[1].split(".")[0]


def test_the_runs_own_receiving_is_the_loops_path(loop: Path, tmp_path: Path):
    """Where the run received its own batches from a worker between its steps
    (capture/loaderfetch), that median is the loop's R: the same hand-over at the moments of
    the steps, where the probe's came after the run at another of the VM's speeds. The probe's
    busy figure, brought to those moments by the ratio of the run's receiving to the probe's
    timed the same way, is what counts on the cores."""
    steps, fetch = [20.0] * 30, [10.0] * 30
    probe = dict(receive_ms=0.5, receive_busy_ms=4.0, busy_workers=2, worker_ms=1.0, tensors=2,
                 receive_waited_ms=2.0)
    ran = LoaderIpc(**probe, receive_run_all_ms=[0.8, 1.0, 1.0, 1.2, 9.0])
    f = _starvation(with_meta(loop, tmp_path / "ran", _meta(steps, fetch, ran)))
    assert f.metrics["receive_in_run"] == 1
    assert f.metrics["receive_ms_per_batch"] == pytest.approx(1.0)  # the median, not the mean
    assert f.metrics["receive_busy_ms_per_batch"] == pytest.approx(4.0 * 1.0 / 2.0)
    # M = 10, F = 10, W = 1 on 2 cores: the loop's path M + R = 11, the worker's rate 11. The
    # cores: with two workers, which fill them, the busy figure, (10 + 10 + 1 + 2) / 2 = 11.5
    # (where the probe's R = 4 alone made it 14: test_the_receiving_with_busy_workers_is_what_
    # counts); with one, a core for each process, the loop's own, (10 + 10 + 1 + 1) / 2 = 11.
    assert f.metrics["fixed_step_ms"] == pytest.approx(11.0)
    assert f.metrics["suggested_num_workers"] == 1
    assert f.est_saving_pct == pytest.approx(100 * (20 - 11.0) / 20, abs=0.05)
    assert "Timed between the run's steps, the loop took 1.00 ms to receive" in f.evidence
    assert "while 2 worker(s) fetch the next ones the loop's receiving takes 2.00 ms" in f.evidence
    # `trainprof try` re-solves the model with both figures.
    assert step_with(f.metrics, 1) == pytest.approx(11.0)
    assert step_with(f.metrics, 2) == pytest.approx(11.5)
    # A busy figure under the run's own is raised to it; too few receives: the probe's alone.
    low = LoaderIpc(**{**probe, "receive_waited_ms": 20.0}, receive_run_all_ms=[1.0] * 3)
    g = _starvation(with_meta(loop, tmp_path / "low", _meta(steps, fetch, low)))
    assert g.metrics["receive_busy_ms_per_batch"] == pytest.approx(1.0)
    few = LoaderIpc(**probe, receive_run_all_ms=[1.0, 1.0])
    h = _starvation(with_meta(loop, tmp_path / "few", _meta(steps, fetch, few)))
    assert h.metrics["receive_in_run"] == 0
    assert h.metrics["receive_ms_per_batch"] == h.metrics["receive_busy_ms_per_batch"] == 4.0
    assert h.metrics["fixed_step_ms"] == pytest.approx(14.0)


def test_the_busy_receiving_counts_on_the_cores(loop: Path, tmp_path: Path):
    """Where the cores bound the fixed step, the receiving from busy workers counts there in
    full, the wait for a worker's hand-shake included: in try_fakedata's and try_jpeg's loops
    with two workers the cores idled 1.6 and 2.4 ms per step, and the bound with only the idle
    worker's figure (the receiving's CPU work) was under the measured step on 6 of 7 rows."""
    steps, fetch = [40.0] * 30, [30.0] * 30
    busy = LoaderIpc(receive_ms=0.5, receive_busy_ms=4.0, busy_workers=2, worker_ms=1.0, tensors=2)
    f = _starvation(with_meta(loop, tmp_path / "busy", _meta(steps, fetch, busy)))
    # M = 10, F = 30, W = 1, R = 4 (0.5 idle) on 2 cores, 2 workers: the loop's path 14, the
    # workers' rate 15.5, the cores (10 + 30 + 1 + 4) / 2 = 22.5 (20.75 with the idle figure).
    assert f.metrics["suggested_num_workers"] == 2
    assert f.metrics["fixed_step_ms"] == pytest.approx(22.5)
    assert f.est_saving_pct == pytest.approx(100 * (40 - 22.5) / 40, abs=0.05)


def test_the_models_own_slowdown_with_fewer_threads(loop: Path, tmp_path: Path):
    """Workers take cores from the model's threads: M ran with 2 threads, the fix leaves one.
    try_fakedata's CNN: 5.6 ms with 2 threads, 8 ms with one. The model scales M by a copy of
    the model timed after the run with each count; without those figures M stays as it ran."""
    steps, fetch = [20.0] * 30, [10.0] * 30
    base = dict(receive_ms=0.5, worker_ms=1.0, tensors=2)
    flat = LoaderIpc(**base)
    scaled = LoaderIpc(**base, model_threads_ms=[[2, 5.0], [1, 8.0]])
    a = _starvation(with_meta(loop, tmp_path / "flat", _meta(steps, fetch, flat)))
    b = _starvation(with_meta(loop, tmp_path / "scaled", _meta(steps, fetch, scaled)))
    # `trainprof try` then checks b's estimate against the whole worker variant (threads too).
    assert (a.metrics["threads_modelled"], b.metrics["threads_modelled"]) == (0, 1)
    assert estimates(tmp_path / "scaled").threads_modelled == {"dataloader-starvation"}
    assert estimates(tmp_path / "flat").threads_modelled == set()
    assert a.metrics["fixed_step_ms"] == pytest.approx(10.75)
    # M = 10 x 8 / 5 = 16 with one thread: the loop's own path 16 + 0.5 bounds the step.
    assert b.metrics["fixed_step_ms"] == pytest.approx(16.5)
    assert b.est_saving_pct == pytest.approx(100 * (20 - 16.5) / 20, abs=0.05)
    assert "would take about 16.0 ms with 1 (a copy of the model" in b.evidence
    assert "not measured" in a.evidence and "not measured" not in b.evidence


def test_the_runs_own_steps_with_fewer_threads_come_first(loop: Path, tmp_path: Path):
    """Steps the run ran round-robin with 2 and 1 threads after its window (capture/threadsteps)
    time M with the fix's threads on the step itself, before any copy of the model: Lightning's
    example, the step minus its fetch 2.7-3.2 ms with 2 threads and 3.9-4.3 with one, where a
    copy's forward and backward scaled it to 5.3-6.1. The 1-thread steps are no plain steps of
    the run: left out of S and F."""
    steps, fetch = [20.0] * 30, [10.0] * 30
    block = list(range(14, 30))  # 8 with 2 threads, 8 with one, the evaluation pass left out
    threads = [[s, 2 if k % 2 == 0 else 1] for k, s in enumerate(block)]
    for s, t in threads:
        if t == 1:
            steps[s] = 10.0 + 12.0  # M with one thread: 12 ms
    steps[17] = 500.0  # a 1-thread step holding an evaluation pass: neither S nor M(1)
    meta = _meta(steps, fetch, LoaderIpc(receive_ms=0.5, worker_ms=1.0, tensors=2,
                                         model_threads_ms=[[2, 5.0], [1, 8.0]]))  # fmt: skip
    meta.thread_steps, meta.eval_steps = threads, [17]
    f = _starvation(with_meta(loop, tmp_path / "steps", meta))
    assert f.metrics["unprofiled_step_ms"] == pytest.approx(20.0)  # the 22 ms steps left out
    # M(1) = 10 x 12 / 10 = 12 from the steps (the copy's 8/5 would give 16); loop path 12.5.
    assert f.metrics["compute_ms_with_fix"] == pytest.approx(12.0)
    assert f.metrics["fixed_step_ms"] == pytest.approx(12.5)
    assert f.metrics["threads_modelled"] == 1
    assert "timed on 7 of the run's steps run with fewer threads" in f.evidence
    # Too few steps of a count (the script ended inside the block): the copy's figures.
    meta.thread_steps = threads[:4]
    g = _starvation(with_meta(loop, tmp_path / "short", meta))
    assert g.metrics["compute_ms_with_fix"] == pytest.approx(16.0)
    assert "a copy of the model" in g.evidence


def test_a_worker_fetches_with_one_thread(loop: Path, tmp_path: Path):
    """The block's one-thread steps time the fetch as a worker runs it: a transform that ran
    faster on the loop's two threads (a large matmul per sample) is more work per batch for a
    worker, and its wall time on two threads understated the CPU it needs. Slower with two
    threads than with one: noise, the loop's figure stands."""
    steps, fetch = [20.0] * 30, [10.0] * 30
    threads = [[s, 2 if k % 2 == 0 else 1] for k, s in enumerate(range(14, 30))]
    for s, t in threads:
        if t == 1:
            fetch[s], steps[s] = 16.0, 26.0  # the fetch 1.6x with one thread, M unchanged
    ipc = LoaderIpc(receive_ms=0.5, worker_ms=1.0, tensors=2)
    meta = _meta(steps, fetch, ipc)
    meta.thread_steps = threads
    f = _starvation(with_meta(loop, tmp_path / "slow", meta))
    # 2 workers (one thread each, the model one): rate (16 + 1) / 2 = 8.5, cores
    # (10 + 16 + 1.5) / 2 = 13.75 > the loop's 10 + 0.5: the cores bound the step.
    assert f.metrics["fixed_step_ms"] == pytest.approx(13.75)
    assert f.metrics["worker_fetch_ms"] == pytest.approx(16.0)
    assert "The fetch itself took 16.0 ms in those steps with one thread" in f.evidence
    for s, t in threads:
        if t == 1:
            fetch[s], steps[s] = 9.0, 19.0
    meta = _meta(steps, fetch, ipc)
    meta.thread_steps = threads
    g = _starvation(with_meta(loop, tmp_path / "fast", meta))
    assert g.metrics["fixed_step_ms"] == pytest.approx((10 + 10 + 1.5) / 2)
    assert "The fetch itself" not in g.evidence


def test_thread_scale_is_linear_in_one_over_threads():
    scale = thread_scale([[8, 2.0], [1, 9.0]], run_threads=8)
    assert scale is not None
    assert scale(8) == pytest.approx(1.0) and scale(1) == pytest.approx(4.5)
    # 1/4 lies 1/7 of the way from 1/8 to 1: 2 + (9 - 2) x (1/4 - 1/8) / (1 - 1/8) = 3.
    assert scale(4) == pytest.approx(1.5)
    assert scale(16) == pytest.approx(1.0)  # flat beyond the points
    assert thread_scale([[1, 9.0]], run_threads=8) is None  # the run's count not timed
    assert thread_scale([], run_threads=2) is None


def _block(steps: list[float], rest_of: dict[int, float]) -> list[list[int]]:
    """Thread steps 14-29, the run's 2 threads and one in turn; `rest_of`: the step minus its
    fetch (10 ms) of the block's k-th step, where not the run's plain 10 ms."""
    threads = [[s, 2 if k % 2 == 0 else 1] for k, s in enumerate(range(14, 30))]
    for k, (s, _) in enumerate(threads):
        steps[s] = 10.0 + rest_of.get(k, 10.0)
    return threads


def test_thread_steps_are_paired_with_their_neighbours(loop: Path, tmp_path: Path):
    """Each one-thread step is taken against the run's-count steps beside it, so that a machine
    that slows down halfway through the block moves both alike; the block's first step, the
    first after the profiling window (the profiler stops, a worker may be forked: 39-56 ms
    against 10-16 in the Hugging Face Trainer's example), is left out."""
    steps, fetch = [20.0] * 30, [10.0] * 30
    # One thread: 12 ms where two take 10; from the block's 9th step on, everything 1.5x.
    rest = {k: (12.0 if k % 2 else 10.0) * (1.5 if k >= 9 else 1.0) for k in range(16)}
    rest[0] = 50.0  # the first step after the window
    threads = _block(steps, rest)
    meta = _meta(steps, fetch, LoaderIpc(receive_ms=0.5, worker_ms=1.0, tensors=2))
    meta.thread_steps = threads
    f = _starvation(with_meta(loop, tmp_path / "paired", meta))
    # Paired: 12/10 in every pair but the one across the change (18 / 12.5): the median 1.2,
    # M(1) = 10 x 1.2. The medians of each count (15 / 10) would say 1.5.
    assert f.metrics["compute_ms_with_fix"] == pytest.approx(12.0)
    assert f.metrics["fixed_step_ms"] == pytest.approx(12.5)


def test_later_blocks_of_thread_steps_are_pooled(loop: Path, tmp_path: Path):
    """A run that goes on times a block again later (capture/threadsteps): this VM's speed moves
    in stretches of seconds, and one block samples one. Each block is cut where its steps stop
    following each other; its first step is left out, and its one-thread steps are paired with
    the run's-count steps of the same block only (never across the seconds between blocks)."""
    steps, fetch = [20.0] * 80, [10.0] * 80
    threads = _block(steps, {k: 18.0 for k in range(1, 16, 2)})  # first block: 1.8x
    later = [[s, 2 if k % 2 == 0 else 1] for k, s in enumerate(range(50, 66))]
    for k, (s, _) in enumerate(later):
        steps[s] = 10.0 + (12.0 if k % 2 else 10.0)  # second block: 1.2x
    steps[49] = steps[66] = 10.0 + 40.0  # slow steps just outside it: no neighbours of its own
    meta = _meta(steps, fetch, LoaderIpc(receive_ms=0.5, worker_ms=1.0, tensors=2))
    meta.thread_steps = threads + later
    f = _starvation(with_meta(loop, tmp_path / "blocks", meta))
    # 16 ratios, 8 at 1.8 and 8 at 1.2: the median 1.5, M(1) = 15; the loop's path 15.5.
    assert f.metrics["compute_ms_with_fix"] == pytest.approx(15.0)
    assert f.metrics["fixed_step_ms"] == pytest.approx(15.5)
    # 14 of 16 steps each left their own first; 1-thread steps: 8 per block, all paired.
    assert "timed on 16 of the run's steps run with fewer threads" in f.evidence
    span = sum(steps[14:66]) / 1000
    assert f", in 2 blocks over {span:.0f} s of the run" in f.evidence
    # One block alone says nothing of blocks.
    meta.thread_steps = threads
    g = _starvation(with_meta(loop, tmp_path / "one", meta))
    assert g.metrics["compute_ms_with_fix"] == pytest.approx(18.0)
    assert "blocks over" not in g.evidence
    # The pairs stay inside their block: with the second block's steps twice as fast, the
    # first block's last one-thread step (29) is taken against step 28 alone, not against 28
    # and the second block's first step of the run's count.
    for s in range(50, 66):
        steps[s] = 10.0 + (steps[s] - 10.0) / 2
    meta = _meta(steps, fetch, None)
    meta.thread_steps = threads + later
    timed = step_threads(SimpleNamespace(meta=meta))
    assert timed is not None and timed.blocks == 2 and timed.steps == 16
    assert timed.ratios[1] == pytest.approx([1.8] * 8 + [1.2] * 8)


def test_fewer_threads_make_the_model_no_faster(loop: Path, tmp_path: Path):
    """One-thread steps that ran faster than their neighbours (the Hugging Face example, 0.84x
    in one run of three, the others 1.05-1.07) claim no saving from the thread change: M with
    the fix's threads stays at least M, in the estimate and in every resample."""
    steps, fetch = [20.0] * 30, [10.0] * 30
    threads = _block(steps, {k: 8.5 for k in range(1, 16, 2)})  # one thread: 0.85x
    meta = _meta(steps, fetch, LoaderIpc(receive_ms=0.5, worker_ms=1.0, tensors=2))
    meta.thread_steps = threads
    f = _starvation(with_meta(loop, tmp_path / "faster", meta))
    # M = 10 either way; the loop's path 10.5 bounds the step (not 8.5 + 0.5).
    assert f.metrics["compute_ms_with_fix"] == pytest.approx(10.0)
    assert f.metrics["fixed_step_ms"] == pytest.approx(10.75)
    assert f.metrics["saving_hi_pct"] <= f.est_saving_pct + 1e-6
    # More threads than the run's are another matter: a copy of the model timed with the run's
    # 2 and the fix's 3 on 4 cores (one worker) may well be faster (the scale is used as is).
    ipc = LoaderIpc(receive_ms=0.5, worker_ms=1.0, tensors=2, model_threads_ms=[[2, 5.0], [3, 4.0]])
    meta = _meta([20.0] * 30, fetch, ipc)
    meta.cpu_count = meta.cpus_online = 4
    g = _starvation(with_meta(loop, tmp_path / "more", meta))
    assert g.metrics["compute_ms_by_workers"][0] == pytest.approx(8.0)


def test_the_estimates_spread_within_the_run(loop: Path, tmp_path: Path):
    """The estimate is a difference of figures each timed on a few steps: the Hugging Face
    Trainer's example gave 0 to 14.9 % in identical runs. The run's samples (its steps, the
    thread steps, the probe's receives) are resampled; the 5th and 95th percentiles of the
    saving go into the metrics and the evidence. The severity stays the estimate's (taken from
    the low end, it flipped Lightning's example between low and high in identical runs)."""
    steps, fetch = [20.0] * 30, [10.0] * 30
    ipc = LoaderIpc(receive_ms=0.5, worker_ms=1.0, tensors=2)
    steady = {k: 13.0 for k in range(1, 16, 2)}  # one thread: 1.3x, every pair alike
    ms_steps = list(steps)
    threads = _block(ms_steps, steady)
    meta = _meta(ms_steps, fetch, ipc)
    meta.thread_steps = threads
    a = _starvation(with_meta(loop, tmp_path / "steady", meta))
    # M(1) = 13: the loop's path 13.5 ms, 32.5 % saved whichever resample.
    assert a.est_saving_pct == pytest.approx(32.5, abs=0.05)
    assert a.metrics["saving_lo_pct"] == pytest.approx(32.5, abs=0.05)
    assert a.metrics["saving_hi_pct"] == pytest.approx(32.5, abs=0.05)
    assert a.severity == "high" and "an identical run may rate it" not in a.evidence
    # The same median ratio (1.3), but three of the eight pairs at 1.8-2.0.
    noisy = {1: 10.0, 3: 11.0, 5: 12.0, 7: 13.0, 9: 13.0, 11: 18.0, 13: 19.0, 15: 20.0}
    ms_steps = list(steps)
    meta.thread_steps = _block(ms_steps, noisy)
    meta.step_times_s = [t / 1000 for t in ms_steps]
    b = _starvation(with_meta(loop, tmp_path / "noisy", meta))
    lo, hi = b.metrics["saving_lo_pct"], b.metrics["saving_hi_pct"]
    assert b.est_saving_pct == pytest.approx(32.5, abs=0.05)
    assert lo < 10.0 <= b.est_saving_pct <= hi
    assert b.severity == "high"
    assert f"the saving is {lo:.1f}-{hi:.1f} %" in b.evidence
    low = "medium" if lo >= 3.0 else "low" if lo > 0 else "info"  # it crosses the 10 % line
    assert f"That spans {low} to high: an identical run may rate it either way." in b.evidence
    # Seeded: the same run reads the same.
    again = _starvation(with_meta(loop, tmp_path / "again", meta))
    assert (again.metrics["saving_lo_pct"], again.metrics["saving_hi_pct"]) == (lo, hi)
    # `trainprof try` shows it beside the estimate.
    assert estimates(tmp_path / "again").spread == {"dataloader-starvation": [lo, hi]}
    # The probe's receives are resampled too: four of nine batches slow leave their median, the
    # estimate's R, as it was; the resamples with five or more move it.
    ms_steps = list(steps)
    meta.thread_steps = _block(ms_steps, steady)
    meta.step_times_s = [t / 1000 for t in ms_steps]
    meta.loader_ipc = LoaderIpc(receive_ms=0.5, worker_ms=1.0, tensors=2, busy_workers=2,
                                receive_busy_ms=0.5, receive_busy_all_ms=[0.5] * 5 + [6.0] * 4)
    c = _starvation(with_meta(loop, tmp_path / "receives", meta))
    assert c.est_saving_pct == pytest.approx(32.5, abs=0.05)
    assert c.metrics["saving_lo_pct"] < 32.0


def test_the_workers_fetch_ratio_is_resampled_for_each_counts_spread(loop: Path, tmp_path: Path):
    """The worker forked between the run's steps times 8-12 pairs, and where one worker barely
    keeps up their median decides the one-worker estimate (try_fakedata: medians 1.41-1.61,
    1.20-1.57, 1.13-1.40 over resamples of three runs' pairs). Each count's saving is resampled
    with them: its spread goes into the metrics for `trainprof try`'s sweep."""
    steps, fetch = [20.0] * 30, [10.0] * 30

    def run(name: str, ratios: list[float]):
        ipc = LoaderIpc(receive_ms=0.5, worker_ms=1.0, tensors=2, worker_fetch_ms=13.0,
                        worker_fetch_ratio=1.3, worker_fetch_ratio_all=ratios,
                        worker_fetch_batches=len(ratios))
        return _starvation(with_meta(loop, tmp_path / name, _meta(steps, fetch, ipc)))

    steady = run("steady", [1.3] * 9)
    # One worker: its rate, 13 + 1 ms a batch, bounds the 20 ms step: 30 % saved, every resample.
    lo, hi = steady.metrics["saving_lo_by_workers"], steady.metrics["saving_hi_by_workers"]
    assert len(lo) == len(hi) == 2  # each count up to the cores
    assert lo[0] == pytest.approx(30.0, abs=0.05) and hi[0] == pytest.approx(30.0, abs=0.05)
    # The same median, the pairs 1.0-1.8: the estimate stands, its spread at one worker widens.
    noisy = run("noisy", [1.0, 1.0, 1.1, 1.2, 1.3, 1.5, 1.6, 1.7, 1.8])
    lo, hi = noisy.metrics["saving_lo_by_workers"], noisy.metrics["saving_hi_by_workers"]
    assert noisy.est_saving_pct == steady.est_saving_pct
    assert lo[0] < 25.0 and hi[0] > 35.0
    # `trainprof try` gives it to the one-worker variant; the suggestion keeps the finding's.
    found = estimates(tmp_path / "noisy")
    assert found.suggested_workers() == 2
    assert found.spread_for("dataloader-starvation", {"num_workers": 1, "threads": 1}) == [
        lo[0], hi[0]]
    assert found.spread_for("dataloader-starvation", {"num_workers": 2, "threads": 1}) == [
        noisy.metrics["saving_lo_pct"], noisy.metrics["saving_hi_pct"]]
    assert found.spread_for("dataloader-starvation", {"threads": 1, "control": True}) is None


def test_the_model_is_solved_again_for_other_counts_and_fixes_together(loop: Path, tmp_path: Path):
    """`trainprof try` measures every worker count of its sweep and all fixes together; their
    estimates come from the same model, re-solved from the finding's metrics, not from a sum.
    many_problems on two cores: the estimates summed to 50.5 %, one worker with bf16 autocast
    measured +30.5 %: a faster model leaves the one worker's rate as the bound."""
    steps, fetch = [30.0] * 30, [20.0] * 30
    ipc = LoaderIpc(receive_ms=0.5, worker_ms=1.0, tensors=2, model_threads_ms=[[2, 5.0], [1, 8.0]])
    f = _starvation(with_meta(loop, tmp_path / "run", _meta(steps, fetch, ipc)))
    m = f.metrics
    # M = 10 with 2 threads, 16 with one; F = 20, R = 0.5, W = 1, 2 cores.
    assert m["model_compute_ms"] == pytest.approx(10.0) and m["cores"] == 2
    assert m["compute_ms_by_workers"] == pytest.approx([16.0, 16.0])
    # The suggestion (2 workers: the cores bound, (16 + 20 + 1.5) / 2) solved again is itself.
    assert m["suggested_num_workers"] == 2
    assert step_with(m, 2) == pytest.approx(m["fixed_step_ms"]) == pytest.approx(18.75)
    # One worker: its rate, 20 + 1, bounds the step.
    assert step_with(m, 1) == pytest.approx(21.0)
    # 5 ms less compute at the run's 2 threads is 8 ms less with one: one worker's rate stays
    # the bound (21), two workers' cores bound falls to (8 + 20 + 1.5) / 2.
    assert step_with(m, 1, less_compute_ms=5.0) == pytest.approx(21.0)
    assert step_with(m, 2, less_compute_ms=5.0) == pytest.approx(14.75)
    assert step_with(m, 3) is None  # beyond the cores: the model has no such count
    assert step_with({"kind": "starvation"}, 1) is None  # no CPU model (a GPU trace)

    # A worker that fetched its next batch straight after in 0.8x the time (capture/loaderfetch):
    # one worker has its rate at 0.8 x 20 + 1 = 17, and two workers' cores' bound falls to
    # (16 + 0.8 x 20 + 1.5) / 2 = 16.75 (18.75 with the cold fetch): two suggested, at that
    # step; the evidence says why.
    ipc.worker_fetch_ratio, ipc.worker_fetch_warm_ratio = 1.0, 0.8
    ipc.worker_fetch_warm_all = [0.8] * 12
    w = _starvation(with_meta(loop, tmp_path / "warm", _meta(steps, fetch, ipc)))
    assert w.metrics["worker_warm_ratio"] == 0.8 and w.metrics["suggested_num_workers"] == 2
    assert step_with(w.metrics, 1) == pytest.approx(17.0)
    assert step_with(w.metrics, 2) == pytest.approx(16.75) == w.metrics["fixed_step_ms"]
    assert "straight after one taken between the run's steps in 0.80x the time" in w.evidence
    assert "straight after" not in f.evidence  # not timed there

    found = estimates(tmp_path / "run")
    assert found.loader is not None and found.suggested_workers() == 2
    dl = "dataloader-starvation"
    # the suggestion's estimate is the diagnosis's own; the model's for the sweep's other count
    assert found.for_workers(dl, {"num_workers": 2, "threads": 1}) is None
    assert found.for_workers(dl, {"num_workers": 1, "threads": 1}) == pytest.approx(30.0)
    assert found.for_workers(dl, {"threads": 1, "control": True}) is None
    found.est["cpu-bf16"] = 100 * 5.0 / 30  # 5 ms of the 30 ms step
    one = [{"rule": dl, "options": {"num_workers": 1, "threads": 1}},
           {"rule": "cpu-bf16", "options": {}}]
    assert found.together(one) == (pytest.approx(30.0), MODEL)  # the sum would say 46.7
    two = [{"rule": dl, "options": {"num_workers": 2, "threads": 1}}, one[1]]
    assert found.together(two) == (pytest.approx(100 * (30 - 14.75) / 30, abs=0.05), MODEL)
    # Without the loader's fix, or without its model, the fixes act on separate parts: a sum.
    found.est["optimizer-foreach"] = 2.0
    rest = [one[1], {"rule": "optimizer-foreach", "options": {}}]
    assert found.together(rest) == (pytest.approx(100 * 5 / 30 + 2.0, abs=0.05), SUM)
    found.loader = None
    assert found.together(one)[1] == SUM


def test_the_workers_fetch_ahead_during_evaluation_passes(loop: Path, tmp_path: Path):
    """Persistent workers go on fetching the training loader's batches while the loop evaluates,
    up to prefetch_factor batches each: the Lightning example (a pass every 20 steps) took
    9.7-12.3 ms a step with one worker, whose own rate is 13.0 ms, the step it took with the
    passes turned off. That takes work off the workers' rate only: workers that keep ahead of
    the loop have their batches made when a pass starts (Lightning's two workers: 5-8 of 8 in
    the queue, one worker 0-2 of 4)."""
    busy = LoaderIpc(receive_ms=0.5, receive_busy_ms=4.0, busy_workers=2, worker_ms=1.0, tensors=2)
    plain = _meta([40.0] * 30, [30.0] * 30, busy)
    passes = _meta([200.0 if i in (10, 20) else 40.0 for i in range(30)], [30.0] * 30, busy)
    passes.eval_steps = [10, 20]
    once = _meta([200.0 if i == 10 else 40.0 for i in range(30)], [30.0] * 30, busy)
    once.eval_steps = [10]
    a = _starvation(with_meta(loop, tmp_path / "plain", plain))
    b = _starvation(with_meta(loop, tmp_path / "passes", passes))
    c = _starvation(with_meta(loop, tmp_path / "once", once))
    assert "eval_every_steps" not in a.metrics and "eval_every_steps" not in c.metrics
    assert c.metrics["fixed_step_ms"] == a.metrics["fixed_step_ms"]  # one pass: no cadence
    assert b.metrics["eval_every_steps"] == 10 and b.metrics["eval_extra_ms"] == pytest.approx(160)
    # M = 10, F = 30, W = 1, R = 4 on 2 cores, a pass every 10 steps 160 ms long: two workers
    # (31 ms a batch each) could make 10.3 batches in it, two each at most (prefetch_factor 2):
    # 0.4 a step, 60 % of the workers' work left in the steps.
    assert eval_ahead(10, 160, 30, 1, 1, n=2, prefetch=2) == pytest.approx(0.4)
    assert eval_ahead(10, 160, 30, 1, 1, n=1, prefetch=2) == pytest.approx(0.2)
    assert eval_ahead(0, 160, 30, 1, 1, n=2, prefetch=2) == 0.0
    # One worker is the bound (31 ms a batch against the loop's 14 and the cores' 22.5): it is
    # behind when a pass starts, and the pass's 0.2 batches a step take its rate to 24.8 ms.
    assert step_with(a.metrics, 1) == pytest.approx(31.0, abs=0.01)
    assert step_with(b.metrics, 1) == pytest.approx(31.0 * 0.8, abs=0.01)
    # With `try`'s prefetch factor (4), 0.4 a step: 18.6 ms, under the cores' bound, which holds.
    assert step_with(b.metrics, 1, prefetch=4) == pytest.approx(22.5, abs=0.01)
    # Two workers keep ahead (15.5 ms a batch against the cores' 22.5): nothing to make in a pass.
    assert step_with(b.metrics, 2) == step_with(a.metrics, 2) == pytest.approx(22.5, abs=0.01)
    assert step_with(b.metrics, 2, prefetch=4) == pytest.approx(22.5, abs=0.01)
    assert b.metrics["fixed_step_ms"] == a.metrics["fixed_step_ms"] == pytest.approx(22.5)
    # `try` measures its own prefetch factor: with passes, even the suggested count's estimate
    # is the model's for that change; without, the diagnosis's own.
    rule = "dataloader-starvation"
    assert estimates(tmp_path / "passes").for_workers(rule, {"num_workers": 1}) == pytest.approx(
        100 * (40 - 22.5) / 40, abs=0.05)
    assert estimates(tmp_path / "plain").for_workers(rule, {"num_workers": 2}) is None


def test_batches_fetched_for_iterators_left_early_count_on_the_cores(loop: Path, tmp_path: Path):
    """An evaluation loader cut short every pass (Lightning's limit_val_batches) leaves the
    batches its workers requested ahead unused, fetched all the same in the steps after the
    pass: Lightning's example measured two workers 13 points below one where the model gave
    both the same step. That work counts on the cores, up to prefetch_factor batches a worker."""
    busy = LoaderIpc(receive_ms=0.5, receive_busy_ms=4.0, busy_workers=2, worker_ms=1.0, tensors=2)
    meta = _meta([40.0] * 30, [30.0] * 30, busy)
    meta.dataloaders.append(DataLoaderInfo(batch_size=16, location="/x/val.py:7",
                                           iter_steps=[10, 20, 30], left_early=[8, 8]))
    f = _starvation(with_meta(loop, tmp_path / "cut", meta))
    assert f.metrics["cut_iterators_per_step"] == [0.1] and f.metrics["cut_batches_left"] == [8]
    # M = 10, F = 30, W = 1, R = 4 on 2 cores (22.5 ms without the cut:
    # test_the_busy_receiving_counts_on_the_cores). Two workers, two batches each in hand: 4
    # of the 8 left fetched every 10 steps, 0.4 batches of 31 ms a step on the cores.
    assert f.metrics["suggested_num_workers"] == 2
    assert f.metrics["fixed_step_ms"] == pytest.approx((10 + 31 + 4 + 0.4 * 31) / 2)
    assert ("Every 10 steps the script stops taking batches from the DataLoader built at "
            "val.py:7, 8 batches before its end") in " ".join(f.evidence.split())
    assert "12.4 ms of the workers' time per step with 2 worker(s)" in " ".join(f.evidence.split())
    # `try`'s prefetch factor (4): all 8 left with two workers, 4 with one (its own rate, 31 ms,
    # the bound then).
    assert step_with(f.metrics, 2, prefetch=4) == pytest.approx((10 + 31 + 4 + 0.8 * 31) / 2)
    assert step_with(f.metrics, 1, prefetch=4) == pytest.approx(31.0)
    # A second loader, iterable (its length unknown: all the workers requested counts), cut
    # once in 20 steps: both count, the evidence names the one cut most often.
    meta.dataloaders.append(DataLoaderInfo(batch_size=4, iter_steps=[5, 25], left_early=[-1]))
    g = _starvation(with_meta(loop, tmp_path / "two", meta))
    assert g.metrics["cut_batches_left"] == [8, -1]
    # Two workers: (10 + 31 + 4 + (0.4 + 0.2) 31) / 2 = 31.8 on the cores; one worker wastes
    # half as much, its own rate the bound, 31 ms: the suggestion moves to one.
    assert step_with(g.metrics, 2) == pytest.approx((10 + 31 + 4 + (0.4 + 0.2) * 31) / 2)
    assert g.metrics["suggested_num_workers"] == 1
    assert g.metrics["fixed_step_ms"] == pytest.approx(31.0)
    assert "val.py:7, 8 batches before its end (and 1 other loader(s) likewise)" in " ".join(
        g.evidence.split())


def test_an_evaluation_loader_left_early_gets_one_batch_a_worker(loop: Path, tmp_path: Path):
    """An evaluation loader (its iterators made with autograd off) cut short every pass: the fix
    gives it prefetch_factor=1, so each worker has one batch requested when the loop stops
    taking them. Lightning's example with one worker: a median training step of 8.8 ms with it,
    10.4 with 4 (six alternated runs of each)."""
    busy = LoaderIpc(receive_ms=0.5, receive_busy_ms=4.0, busy_workers=2, worker_ms=1.0, tensors=2)
    meta = _meta([40.0] * 30, [30.0] * 30, busy)
    meta.dataloaders.append(DataLoaderInfo(
        batch_size=16, location="/x/val.py:7", iter_steps=[10, 20, 30], left_early=[8, 8],
        iterators=3, grad_off_iters=3))
    f = _starvation(with_meta(loop, tmp_path / "eval", meta))
    assert f.metrics["cut_evaluation"] == [1] and f.metrics["cut_locations"] == ["/x/val.py:7"]
    # M = 10, F = 30, W = 1, R = 4 on 2 cores: two workers, one batch each in hand, 2 of the 8
    # left fetched every 10 steps, 0.2 batches of 31 ms a step on the cores (0.4 at
    # prefetch_factor 2: test_batches_fetched_for_iterators_left_early_count_on_the_cores).
    assert f.metrics["suggested_num_workers"] == 2
    assert f.metrics["fixed_step_ms"] == pytest.approx((10 + 31 + 4 + 0.2 * 31) / 2)
    text = " ".join(f.evidence.split())
    assert ("The fix gives that evaluation loader prefetch_factor=1, one batch a worker: 6.20 ms "
            "of the workers' time per step with 2 worker(s)") in text
    assert ("DataLoader(..., num_workers=2, persistent_workers=True, prefetch_factor=1) for the "
            "evaluation loader built at val.py:7" in f.fix)
    # `try`'s prefetch factor (4) is the training loader's: the evaluation's waste is the same.
    assert step_with(f.metrics, 2, prefetch=4) == pytest.approx(f.metrics["fixed_step_ms"])
