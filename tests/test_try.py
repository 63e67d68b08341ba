"""`trainprof try`: the runtime fixes (in-process, real torch), the statistics, and real runs of
small CPU scripts re-run without and with fixes."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from test_run_cli import ROOT, SCRIPTS, SMALL, run, trainprof
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainprof.capture.patching import Patches
from trainprof.runmeta import (
    DataLoaderInfo,
    RunMeta,
    earlier_tries,
    is_try_file,
    keep_earlier_try,
    write_meta,
)
from trainprof.tryfix import catalog, measure
from trainprof.tryfix.apply import Applied, install
from trainprof.tryfix.command import Trial, TryOptions
from trainprof.tryfix.measure import (
    pace,
    resampled_medians,
    saving,
    timed_steps,
    verdict,
    within_target,
)
from trainprof.tryfix.runfolder import load_run

MLP = str(SCRIPTS / "try_mlp.py")
API_BLOCK = str(SCRIPTS / "try_api_block.py")
SHARING = str(SCRIPTS / "try_sharing.py")


# ----- the fixes, applied in this process ------------------------------------------------------
def test_fixes_apply_and_are_undone() -> None:
    from torchmetrics.aggregation import MaxMetric, MeanMetric

    specs = [
        {"rule": "zero-grad-not-none"},
        {"rule": "optimizer-foreach"},
        {"rule": "metric-sync"},
        {"rule": "dataloader-starvation", "options": {"num_workers": 2}},
    ]
    patches, applied = Patches(), Applied()
    install(specs, patches, applied)
    model = nn.Linear(4, 2)
    try:
        adam = torch.optim.Adam(model.parameters(), lr=0.1, foreach=False)
        assert adam.defaults["fused"] is True  # fused on CPU parameters
        rms = torch.optim.RMSprop(model.parameters())  # no fused kernel: foreach
        assert rms.defaults["foreach"] is True
        model(torch.randn(3, 4)).sum().backward()
        adam.zero_grad(set_to_none=False)
        assert model.weight.grad is None
        assert MeanMetric().nan_strategy == "disable"
        assert MaxMetric(nan_strategy="error").nan_strategy == "disable"
        loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
        assert loader.num_workers == 2 and loader.persistent_workers
        assert loader.prefetch_factor == 4
    finally:
        patches.restore()
    assert torch.optim.Adam(model.parameters()).defaults["fused"] is None
    assert MeanMetric().nan_strategy == "warn"
    assert DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2).num_workers == 0
    model(torch.randn(3, 4)).sum().backward()
    torch.optim.SGD(model.parameters()).zero_grad(set_to_none=False)
    assert model.weight.grad is not None


def _evaluation_loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)


def test_an_evaluation_loader_left_early_gets_one_batch_a_worker() -> None:
    """The evaluation loader the run saw cut short, found by where the script builds it (as
    `run` records it), gets prefetch_factor=1; the others try's 4."""
    code = _evaluation_loader.__code__
    where = f"{code.co_filename}:{code.co_firstlineno + 1}"
    spec = {"rule": "dataloader-starvation",
            "options": {"num_workers": 2, "evaluation_loaders": [where]}}
    patches, applied = Patches(), Applied()
    install([spec], patches, applied)
    try:
        assert _evaluation_loader().prefetch_factor == 1
        assert DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2).prefetch_factor == 4
    finally:
        patches.restore()
    assert applied.notes == [
        f"prefetch_factor=1 for the evaluation DataLoader built at {Path(where).name}"]
    opts = catalog.variants_for("dataloader-starvation", 2, False, 0, evaluation=[where])
    assert [o.get("evaluation_loaders") for o in opts] == [[where], [where], None]
    assert catalog.change_text("dataloader-starvation", opts[1]) == (
        "DataLoader(num_workers=2, persistent_workers=True, prefetch_factor=4) + prefetch_factor=1 "
        f"for the evaluation loader built at {Path(where).name} + torch.set_num_threads(1)")
    assert ("DataLoader(..., num_workers=2, persistent_workers=True, prefetch_factor=1) for the "
            f"evaluation loader built at {Path(where).name}"
            in catalog.permanent_text("dataloader-starvation", opts[1]))


def test_no_workers_variant_drops_worker_only_arguments() -> None:
    patches = Patches()
    install([{"rule": "dataloader-starvation", "options": {"num_workers": 0}}], patches, Applied())
    try:
        loader = DataLoader(
            TensorDataset(torch.randn(8, 2)), batch_size=2, num_workers=2,
            persistent_workers=True, prefetch_factor=3,
        )
        assert loader.num_workers == 0 and not loader.persistent_workers
    finally:
        patches.restore()


def test_bf16_autocast_wraps_the_root_module_only() -> None:
    patches, applied = Patches(), Applied()
    install([{"rule": "cpu-bf16"}], patches, applied)
    try:
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        inner = []  # the dtype inside the model, at each call
        model[2].register_forward_hook(lambda m, i, o: inner.append(o.dtype))
        loss_fn = nn.MSELoss()  # no parameters: not the model
        x = torch.randn(4, 8)
        model(x)  # found during this call: the next calls are autocast
        second = model(x)
        loss_fn(second, torch.zeros(4, 2))
    finally:
        patches.restore()
    assert inner == [torch.float32, torch.bfloat16]
    # The output goes back to fp32 for the loss, which autocast would run in fp32 too.
    assert second.dtype == torch.float32
    assert applied.notes == ["bf16 autocast on Sequential.forward (cpu)"]


def test_cuda_only_fixes_are_skipped_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine applies them")
    patches, applied = Patches(), Applied()
    install([{"rule": "pageable-memcpy"}, {"rule": "tf32-off"}], patches, applied)
    patches.restore()
    assert set(applied.skipped) == {"pageable-memcpy", "tf32-off"}


def test_worker_sweep_is_powers_of_two_up_to_the_cores() -> None:
    assert catalog.worker_counts(2, 0) == [1, 2]
    assert catalog.worker_counts(6, 0) == [1, 2, 4, 6]
    assert catalog.worker_counts(8, 2) == [0, 1, 4, 8]
    opts = catalog.variants_for("dataloader-starvation", 2, False, 0)
    assert opts == [
        {"num_workers": 1, "threads": 1},
        {"num_workers": 2, "threads": 1},
        {"threads": 1, "control": True},  # the thread change alone, never the pick
    ]
    assert catalog.variants_for("dataloader-starvation", 4, True, 0)[0] == {"num_workers": 1}
    # A run already on one intra-op thread: nothing to lower, no control to split off (it would
    # be the baseline again, and its noise would be charged to the workers).
    assert catalog.variants_for("dataloader-starvation", 2, False, 0, threads=1) == [
        {"num_workers": 1}, {"num_workers": 2},
    ]
    assert catalog.variants_for("dataloader-starvation", 4, False, 0, threads=2) == [
        {"num_workers": 1}, {"num_workers": 2}, {"num_workers": 4, "threads": 1},
        {"threads": 1, "control": True},
    ]


def test_receiving_variants_and_the_strategy_patch_is_undone() -> None:
    # pin_memory already on: the file_system strategy only; on a CPU never pin_memory.
    assert catalog.variants_for("dataloader-starvation", 4, True, 4, kind="receiving",
                                pinned=True) == [{"sharing_strategy": "file_system"}]
    assert catalog.variants_for("dataloader-starvation", 4, False, 4, kind="receiving") == [
        {"sharing_strategy": "file_system"}]
    before = torch.multiprocessing.get_sharing_strategy()
    assert before != "file_system"
    seen = []
    patches, applied = Patches(), Applied()
    install([{"rule": "dataloader-starvation", "options": {"sharing_strategy": "file_system"}}],
            patches, applied)
    try:
        assert torch.multiprocessing.get_sharing_strategy() == "file_system"
        loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2, num_workers=2,
                            worker_init_fn=seen.append)
        assert loader.num_workers == 2  # the loader as the script built it, but for:
        torch.multiprocessing.set_sharing_strategy(before)
        loader.worker_init_fn(1)  # what a worker runs first: the strategy, then the script's
        assert torch.multiprocessing.get_sharing_strategy() == "file_system" and seen == [1]
    finally:
        patches.restore()
    assert torch.multiprocessing.get_sharing_strategy() == before
    assert DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2).worker_init_fn is None


# ----- statistics --------------------------------------------------------------------------------
def test_saving_interval_and_verdicts() -> None:
    base = [[10.0, 10.2, 9.8, 10.1] * 5 for _ in range(3)]
    fast = [[8.0, 8.1, 7.9, 8.05] * 5 for _ in range(3)]
    m, lo, hi = saving(base, fast)
    assert 19 < m < 21 and lo <= m <= hi and lo > 15
    assert verdict(20.0, m, lo, hi) == "confirmed"
    assert verdict(40.0, m, lo, hi) == "smaller"
    m2, lo2, hi2 = saving(base, base)
    assert m2 == 0 and verdict(5.0, m2, lo2, hi2) == "none"
    m3, lo3, hi3 = saving(fast, base)
    assert verdict(5.0, m3, lo3, hi3) == "slower"
    assert within_target(18.1, -0.9) is False  # the FakeData case


def test_each_resample_draws_from_the_rounds_it_picked_at_their_own_lengths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bootstrap's draws (measure.resampled_medians): a row of picks names the rounds of one
    resample, each drawn to its own length, and nothing past it (the padding) counts."""
    rng = np.random.default_rng(0)
    short, long = np.array([5.0]), np.array([1.0, 1.0, 1.0])
    picks = np.array([[0, 0], [1, 1], [0, 1], [1, 0]])
    assert resampled_medians([short, long], picks, rng).tolist() == [5.0, 1.0, 1.0, 1.0]
    # Within a round, draws with replacement: a round of 0s and 10s gives medians of 0, 5 or
    # 10, each sometimes, and about as often 0 as 10 over many resamples.
    mixed = np.array([0.0, 10.0])
    got = resampled_medians([mixed], np.zeros((4000, 1), dtype=int), rng)
    assert set(got.tolist()) == {0.0, 5.0, 10.0}
    assert abs(float(np.mean(got)) - 5.0) < 0.3
    # Drawn in chunks of rows (here one at a time: 2 rounds of up to 3 values a row is 6 of
    # the 7 allowed): every row is drawn, once.
    monkeypatch.setattr(measure, "CHUNK_VALUES", 7)
    rows = resampled_medians([short, long], picks, rng)
    assert rows.tolist() == [5.0, 1.0, 1.0, 1.0]


def test_three_rounds_that_disagree_confirm_nothing() -> None:
    """Each round tight inside, the rounds apart (a machine whose load drifts between them):
    savings of 10, 1 and 7 % are no evidence of a saving, however narrow each round is."""
    base = [[10.0, 10.01, 9.99] * 5 for _ in range(3)]
    variant = [[v, v + 0.01, v - 0.01] * 5 for v in (9.0, 9.9, 9.3)]
    m, lo, hi = saving(base, variant)
    assert 5 < m < 7
    assert lo < 0 < hi  # the bootstrap of these 3 rounds alone said [1, 10]
    assert verdict(0.0, m, lo, hi) == "none"
    assert within_target(2.0, 0.5) is True and within_target(12.0, 10.0) is True
    assert within_target(None, 3.0) is None


def test_rounds_that_cannot_tell_the_estimate_from_0_say_how_many_could() -> None:
    """The rounds above (savings of 10, 1 and 7 %, an interval holding 0): how many rounds the
    t interval needs at their spread to be at most half of a 6 % estimate wide on each side."""
    base = [[10.0, 10.01, 9.99] * 5 for _ in range(3)]
    variant = [[v, v + 0.01, v - 0.01] * 5 for v in (9.0, 9.9, 9.3)]
    savings = measure.per_round(base, variant)
    assert savings == pytest.approx([10.0, 1.0, 7.0], abs=0.01)
    tell = measure.rounds_to_tell
    k = tell(6.0, savings)  # sd 4.58: t(k-1) * 4.58 / sqrt(k) <= 3 from k = 12
    assert k == 12
    assert tell(12.0, savings) < k  # a larger saving is told sooner
    assert tell(0.5, savings) == measure.MAX_ROUNDS + 1  # beyond what is worth running
    assert tell(None, savings) is None and tell(0.0, savings) is None
    assert tell(6.0, [5.0]) is None and tell(6.0, [5.0, 5.0]) is None


def test_steps_that_alternate_count_at_their_pace() -> None:
    """Three workers that fall behind hand batches over in bursts of three: one long step, two
    short ones, 10 ms a step on average, as the baseline. The median step (3 ms) would call that
    70 % faster; the blocks' means see no saving."""
    base = [[10.0 + 0.1 * (i % 3) for i in range(48)] for _ in range(3)]
    bursts = [[24.0 if i % 3 == 0 else 3.0 for i in range(48)] for _ in range(3)]
    m, lo, hi = saving(base, bursts)
    assert abs(m) < 2 and lo <= m <= hi and verdict(30.0, m, lo, hi) in ("none", "smaller")
    assert abs(pace(bursts) - 10.0) < 0.5 and abs(pace(base) - 10.1) < 0.1


def test_a_stall_is_outvoted_by_the_other_blocks() -> None:
    """One 45 ms stall among 0.4 ms steps would add 38 % to a round's mean: the median over
    blocks leaves its block out."""
    steps = [0.4] * 60
    stalled = [*steps[:20], 45.0, *steps[21:]]
    assert pace([stalled]) == pytest.approx(0.4)
    m, _, _ = saving([steps, steps, steps], [stalled, steps, steps])
    assert m == pytest.approx(0.0, abs=1e-9)


def test_compile_steps_are_left_out_without_losing_the_steady_state() -> None:
    # step 0 imports Dynamo, step 1 compiles, step 17 recompiles (a new shape): 2 s steps
    times = [1.2, 2.4] + [0.01] * 15 + [2.0] + [0.01] * 2
    t = timed_steps(times, [1, 17], warmup=5)
    assert t.head == 5 and t.recompiles == [17]
    assert len(t.kept) == 20 - 5 - 2 and max(t.kept) == 0.01  # 17 and 18 dropped, not 0-17
    late = timed_steps([1.0] * 12, [10], warmup=5)  # first compiled late: all before it dropped
    assert late.head == 12 and late.kept == [] and late.recompiles == []
    assert timed_steps([0.5] * 8, [], warmup=5).kept == [0.5] * 3


def test_steps_that_evaluate_are_not_timed() -> None:
    # Validation in steps 2, 8 and 16 (each 20x a training step); 2 falls in the warm-up.
    times = [0.01] * 20
    times[8] = times[16] = 0.2
    t = timed_steps(times, [], warmup=5, eval_steps=[16, 2, 8])
    assert t.evals == [8, 16] and t.head == 5
    assert len(t.kept) == 20 - 5 - 2 and max(t.kept) == 0.01
    # The header says where the script ended the rounds, and what else was not timed.
    from trainprof.report.tryout import render_try_text

    doc = {"steps_per_round": 229, "warmup_steps_discarded": 5, "fixes": [],
           "baseline": {"rounds": 2, "median_ms": 10.0, "steps_run": [20, 20],
                        "eval_steps": [[8, 16], [8, 16]]}}
    text = render_try_text(doc)
    assert ("2 rounds of 20 steps (where the script ends), the first 5 of each not timed, nor "
            "the 2 that evaluate") in text
    doc["baseline"].update(steps_run=[229, 229], eval_steps=None)
    assert "2 rounds of 229 steps, the first 5 of each not timed\n" in render_try_text(doc)


# ----- bad input ---------------------------------------------------------------------------------
def test_bare_trace_folder_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "host_1.1.pt.trace.json").write_text('{"traceEvents": []}')
    done = trainprof("try", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "no recorded command" in done.stderr
    assert not (tmp_path / "try.json").exists()


def test_jobs_try_cannot_rerun_are_refused_in_one_line(tmp_path: Path) -> None:
    """A torchrun job on two machines, ranks the script started with a rendezvous elsewhere, a
    job without rank 0's command, and a process that trained with a world size but left no rank
    files: one line that says why and what to do, not "a bare trace". (A job on one machine is
    re-run: test_try_job.)"""
    nodes, elsewhere, headless, selfstarted = (tmp_path / n for n in
                                               ("nodes", "elsewhere", "headless", "ddp"))
    for folder in (nodes, elsewhere, headless, selfstarted):
        folder.mkdir()
    for r in (0, 1):  # ranks 0 and 1 of 4, two per machine
        write_meta(RunMeta(argv=[MLP], cwd=str(ROOT), rank=r, world_size=4, local_world_size=2,
                           torchrun=True), nodes, f"trainprof.rank{r}.json")
        # Lightning's ddp with a MASTER_ADDR that is not this machine's: ranks here unknown
        write_meta(RunMeta(argv=[MLP], cwd=str(ROOT), rank=r, world_size=2), elsewhere,
                   f"trainprof.rank{r}.json")
    write_meta(RunMeta(rank=1, world_size=2), headless, "trainprof.rank1.json")
    write_meta(RunMeta(argv=[MLP], cwd=str(ROOT), rank=0, world_size=4, step_times_s=[0.1]),
               selfstarted)
    for folder, words in ((nodes, ["is a job of 4 ranks on 2 machines", "this machine only"]),
                          (elsewhere, ["is a job of 2 ranks not all on this machine"]),
                          (headless, ["is a job of 2 ranks without rank 0's recorded command"]),
                          (selfstarted, ["is a job of 4 ranks whose ranks this run did not "
                                         "record as a job", "--nproc-per-node N"])):
        done = trainprof("try", str(folder))
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert all(w in done.stderr for w in words), done.stderr
        assert not (folder / "try.json").exists()


def test_runs_without_a_command_to_start_again_are_refused_in_one_line(tmp_path: Path) -> None:
    """A trainprof.profile() block in a notebook records no command; a script moved since the
    run is not found where the rounds would start it. One line each, not a failed baseline."""
    kernel, moved = tmp_path / "kernel", tmp_path / "moved"
    kernel.mkdir()
    moved.mkdir()
    write_meta(RunMeta(argv=[], cwd=str(tmp_path), script="/tmp/ipykernel_1/2.py"), kernel)
    write_meta(RunMeta(argv=["train.py", "--lr", "1"], cwd=str(tmp_path)), moved)
    for folder, words in ((kernel, ["has no command to start again", "notebook"]),
                          (moved, [f"train.py, is not in {tmp_path} any more"])):
        done = trainprof("try", str(folder))
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert all(w in done.stderr for w in words), done.stderr
        assert not (folder / "try.json").exists()


def test_unknown_fix_is_refused(tmp_path: Path) -> None:
    write_meta(RunMeta(argv=[MLP], cwd=str(ROOT)), tmp_path)
    done = trainprof("try", str(tmp_path), "--fix", "no-such-rule")
    assert done.returncode == 2 and "unknown rule 'no-such-rule'" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_earlier_trys_results_are_kept_beside_the_new_one(tmp_path: Path) -> None:
    assert keep_earlier_try(tmp_path) is None  # nothing to keep
    (tmp_path / "try.json").write_text("a")
    assert keep_earlier_try(tmp_path) == tmp_path / "try.1.json"
    (tmp_path / "try.json").write_text("b")
    (tmp_path / "try.7.json").write_text("c")  # numbers kept by hand, or a gap: one past
    assert keep_earlier_try(tmp_path) == tmp_path / "try.8.json"
    assert not (tmp_path / "try.json").exists()
    assert earlier_tries(tmp_path) == ["try.1.json", "try.7.json", "try.8.json"]
    assert [(tmp_path / n).read_text() for n in earlier_tries(tmp_path)] == ["a", "c", "b"]
    assert is_try_file("try.json") and is_try_file("try.12.json")
    assert not is_try_file("try.x.json") and not is_try_file("retry.1.json")


def _recorded(folder: Path, *args: str) -> Path:
    """A run folder with the metadata `trainprof run` records, without running the profiler."""
    folder.mkdir()
    meta = RunMeta(argv=[MLP, *args], cwd=str(ROOT), cpu_count=2, wall_time_s=5.0,
                   dataloaders=[DataLoaderInfo(num_workers=0)])
    write_meta(meta, folder)
    return folder


# ----- real runs ---------------------------------------------------------------------------------
def _files_in(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind", ["torch", "lightning", "hf", "hf-resume", "accelerate", "accelerate-resume", "files"]
)
def test_rounds_leave_the_runs_checkpoints_and_logs_as_they_were(tmp_path: Path, kind: str):
    # The run: 15 steps, a checkpoint every 5 (and Lightning's lightning_logs/ in the working
    # folder), with weights of its own random start. The rounds' temp folder is another than
    # the one `work` is in: what a script writes in the temp folder is its scratch, left alone.
    work = tmp_path / "work"
    work.mkdir()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    script = str(SCRIPTS / "try_records.py")
    first = subprocess.run([sys.executable, script, kind.split("-")[0], str(work)], cwd=work,
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    before = _files_in(work)
    assert before  # ckpt.pt; ckpt/ and lightning_logs/; out/checkpoint-5, -10, -15; ...
    folder = tmp_path / "run"
    folder.mkdir()
    # -resume: a script that resumes from its last checkpoint (the run's), 30 steps in all.
    name, _, resume = kind.partition("-")
    argv = [script, name, str(work)] + (["30", "resume"] if resume else [])
    write_meta(RunMeta(argv=argv, cwd=str(work), cpu_count=2, wall_time_s=5.0), folder)
    # Rounds of 12 steps: each saves at steps 5 and 10, over the run's files before the fix
    # (a round of its own for the fix: switched, it would run both sides in longer rounds).
    done = trainprof("try", str(folder), "--fix", "zero-grad-not-none", "--rounds", "1",
                     "--steps", "12", "--separate", env={**os.environ, "TMPDIR": str(scratch)})
    assert done.returncode == 0, done.stderr
    doc = json.loads((folder / "try.json").read_text())
    assert doc["baseline"]["rounds"] == 1 and doc["fixes"][0]["measured_pct"] is not None
    assert _files_in(work) == before  # nothing written, added or removed
    # accelerate: its project folder (its automatic naming deletes the oldest checkpoints).
    where = {"torch": work / "ckpt.pt", "lightning": work / "ckpt", "hf": work / "out",
             "accelerate": work, "files": work / "train.log"}[name]
    assert str(where) in doc["redirected"]
    if kind == "files":  # each way of writing, and nothing of the temp folder's
        assert {str(work / n) for n in ("weights.npy", "state.json", "events.log", "keep-5.txt",
                                        "old/x.txt", "w.safetensors", "pretrained")} <= set(
            doc["redirected"])
        assert not [p for p in doc["redirected"] if p.startswith(str(scratch))]
    if kind == "lightning":  # its default logger's folder: the working folder
        assert str(work) in doc["redirected"]
    if name in ("lightning", "hf"):
        # Validation every 4 steps, each 50 ms more: those after the warm-up are not timed
        # (8; a resumed run's 5 and 9). Not told by their time: on a loaded machine the other
        # steps took 60-96 ms too.
        base = doc["baseline"]
        (evals,) = base["eval_steps"]
        assert evals and 5 <= evals[0] < 9 and evals == list(range(evals[0], 12, 4)), evals
        assert base["steps_run"] == [12] and len(base["step_times_ms"][0]) == 12 - 5 - len(evals)
        assert doc["fixes"][0]["eval_steps"] == [evals]
    else:
        assert doc["baseline"]["eval_steps"] is None
    if kind == "torch":  # SummaryWriter's default folder
        assert str(work / "runs") in doc["redirected"]
    assert "what the run wrote is as it was" in done.stdout


@pytest.mark.slow
def test_try_measures_a_fix_against_the_recorded_run(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    rec = run(folder, *SMALL, "--max-steps", "12", MLP, "40", diagnose=True)
    assert rec.code == 0, rec.stderr
    meta = rec.meta
    assert meta["cwd"] == str(ROOT) and meta["executable"] == sys.executable
    est = json.loads(trainprof("diagnose", "--json", str(folder)).stdout)
    foreach = [f for f in est["findings"] if f["rule"] == "optimizer-foreach"]
    done = trainprof("try", str(folder), "--fix", "optimizer-foreach", "--rounds", "1",
                     "--steps", "15")
    assert done.returncode == 0, done.stderr
    doc = json.loads((folder / "try.json").read_text())
    assert doc["schema"] == 1 and doc["profiled"] is False
    assert doc["baseline"]["rounds"] == 1 and len(doc["baseline"]["step_times_ms"][0]) == 10
    # The run kept the script as it ran, and the rounds ran it unchanged.
    assert MLP in meta["sources"] and doc["sources_changed"] == []
    assert "changed since the run" not in done.stderr
    (fix,) = doc["fixes"]
    assert fix["rule"] == "optimizer-foreach" and "fused=True" in fix["permanent_fix"]
    assert fix["measured_pct"] is not None and fix["ci_pct"][0] <= fix["ci_pct"][1]
    # Switched off and on inside its own round (the script's 40 steps hold one pair of blocks of
    # 1 + 12 after the warm-up), both sides' steps kept: what its figure can be scored again from.
    switched = fix["switched"]
    assert switched["block_steps"] == 12 and switched["transition_steps"] == 1
    assert [len(r) for r in fix["step_times_ms"]] == [12] and fix["rounds"] == 1
    assert [len(r) for r in switched["without_step_times_ms"]] == [12]
    # (the median and each step rounded to the µs, half of it each: the median against the mean
    # of the rounded steps is off by up to 2 halves, 0.326 against 0.3255 in one fresh clone)
    us = 0.0005
    assert fix["median_ms"] == pytest.approx(statistics.mean(fix["step_times_ms"][0]),
                                             abs=2 * us)
    without = statistics.mean(switched["without_step_times_ms"][0])
    assert switched["without_median_ms"] == pytest.approx(without, abs=2 * us)
    assert fix["measured_pct"] == pytest.approx(100 * (1 - fix["median_ms"] / without),
                                                abs=0.05 + 100 * 2 * us / without)
    assert "switched off and on between steps, in blocks of 12 timed steps" in done.stdout
    assert fix["verdict"] in ("confirmed", "smaller", "none", "slower")
    if foreach:
        assert fix["estimated_pct"] == round(foreach[0]["est_saving_pct"], 1)
    assert "optimizer-foreach" in done.stdout and "in code:" in done.stdout
    # The machine's speed in the baseline's round against the run's: the reference timed at the
    # step boundaries of both (a CPU run), and the step the estimates are shares of.
    machine = doc["machine"]
    assert machine["run_ref_ms"] > 0 and machine["rounds_ref_ms"] > 0
    assert machine["ratio"] == pytest.approx(machine["rounds_ref_ms"] / machine["run_ref_ms"],
                                             rel=0.01)
    # Other processes' CPU use in the run and (each round's, their median) in the rounds.
    assert machine["run_other_cpus"] >= 0 and machine["rounds_other_cpus"] >= 0
    assert isinstance(machine["load_differs"], bool) and machine["cpus"] >= 1
    # The hypervisor's steal likewise (a share of the CPU time wanted, each round's)
    assert 0 <= machine["run_steal_share"] <= 1 and 0 <= machine["rounds_steal_share"] <= 1
    assert isinstance(machine["steal_differs"], bool)
    assert doc["run_step_basis"] == "unprofiled" and doc["run_step_ms"] > 0
    assert "machine: a fixed piece of work between steps took" in done.stdout
    assert 'id="try"' in (folder / "report.html").read_text()
    events = b"".join(p.read_bytes() for p in folder.glob("events.out.tfevents.*"))
    assert b"trainprof/try" in events
    assert doc["earlier"] == []
    # A second try, of another fix, keeps the first one's results (never overwritten).
    first = (folder / "try.json").read_bytes()
    again = trainprof("try", str(folder), "--fix", "zero-grad-not-none", "--rounds", "1",
                      "--steps", "15")
    assert again.returncode == 0, again.stderr
    assert (folder / "try.1.json").read_bytes() == first
    doc = json.loads((folder / "try.json").read_text())
    assert [f["rule"] for f in doc["fixes"]] == ["zero-grad-not-none"]
    assert doc["earlier"] == ["try.1.json"]
    assert f"kept as {folder / 'try.1.json'}" in again.stderr
    assert "earlier tries' results in the run folder: try.1.json" in again.stdout
    assert "try.1.json" in (folder / "report.html").read_text()
    log = (folder / "try.log").read_text()  # both tries' rounds, each try's begin marked
    assert log.count("##### trainprof try (") == 2 and "(zero-grad-not-none; 1 round)" in log


@pytest.mark.slow
def test_a_with_block_run_is_tried_by_running_its_script_again(tmp_path: Path) -> None:
    """trainprof.profile() records the process's command (the script and its arguments); `try`
    runs the script again, its block unprofiled in the rounds (not "already being profiled"),
    the block's run folder left as it was."""
    folder = tmp_path / "run"
    rec = subprocess.run([sys.executable, API_BLOCK, str(folder), "60"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=240)
    assert rec.returncode == 0 and "profiled" in rec.stdout, rec.stderr
    meta = json.loads((folder / "trainprof.json").read_text())
    assert meta["argv"] == [API_BLOCK, str(folder), "60"] and meta["cwd"] == str(tmp_path)
    recorded = (folder / "trainprof.json").read_bytes()
    done = trainprof("try", str(folder), "--fix", "zero-grad-not-none", "--rounds", "1",
                     "--steps", "40")
    assert done.returncode == 0, done.stderr
    (fix,) = json.loads((folder / "try.json").read_text())["fixes"]
    assert fix["measured_pct"] is not None and fix["verdict"] != "error", fix
    log = (folder / "try.log").read_text()
    assert "already being profiled" not in log and "not profiled loss" in log
    assert (folder / "trainprof.json").read_bytes() == recorded


@pytest.mark.slow  # a round in a subprocess, left to run past its limit
@pytest.mark.skipif(not hasattr(signal, "SIGRTMIN"), reason="a realtime signal")
def test_a_round_past_its_time_limit_says_where_it_hung(tmp_path: Path) -> None:
    """A round killed at its deadline first prints every thread's stack into its log (for
    try.log), so that a hang can be told from a slow round, and where it hung."""
    from trainprof.tryfix.spawn import wait

    started = tmp_path / "started"  # written once the round runs the script
    (tmp_path / "stuck.py").write_text(
        "import pathlib, time\n\ndef stuck():\n"
        f"    pathlib.Path({str(started)!r}).touch()\n    time.sleep(120)\n\nstuck()\n")
    with open(tmp_path / "try.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainprof.tryfix.round", "--result",
             str(tmp_path / "result.json"), "--", str(tmp_path / "stuck.py")],
            cwd=ROOT, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        # Not a fixed sleep: on a loaded machine the round was still importing torch after 3 s.
        deadline = time.monotonic() + 120
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the round did not start the script"
        time.sleep(0.2)  # into the sleep
        t0 = time.monotonic()
        code = wait(proc, time.monotonic())
    assert code == -signal.SIGKILL and time.monotonic() - t0 < 60
    text = (tmp_path / "try.log").read_text()
    assert "most recent call first" in text and "in stuck" in text, text


@pytest.mark.slow
def test_a_fix_that_crashes_the_script_does_not_stop_the_others(tmp_path: Path) -> None:
    folder = _recorded(tmp_path / "run", "40", "--strict")
    done = trainprof("try", str(folder), "--fix", "dataloader-starvation", "--fix",
                     "zero-grad-not-none", "--rounds", "1", "--steps", "12")
    assert done.returncode == 0, done.stderr
    doc = json.loads((folder / "try.json").read_text())
    by_rule = {f["rule"]: f for f in doc["fixes"]}
    starved = by_rule["dataloader-starvation"]
    assert starved["verdict"] == "error" and "needs num_workers=0" in starved["error"]
    assert by_rule["zero-grad-not-none"]["measured_pct"] is not None
    assert doc["combined"]["rules"] == []  # one fix measured at most: nothing to combine


@pytest.mark.slow
def test_ctrl_c_keeps_the_rounds_done_so_far(tmp_path: Path) -> None:
    folder = _recorded(tmp_path / "run", "100000")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainprof.cli", "try", str(folder), "--fix",
         "zero-grad-not-none", "--rounds", "5", "--steps", "8"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
        # A shell runs background jobs with SIGINT ignored, which the child would inherit (and
        # Python then never raises KeyboardInterrupt): a suite started that way failed here.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 90
    while not (folder / "try.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (folder / "try.json").exists(), proc.communicate(timeout=5)
    os.killpg(proc.pid, signal.SIGINT)  # like Ctrl-C in a terminal: the whole group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    doc = json.loads((folder / "try.json").read_text())
    assert doc["interrupted"] is True and doc["baseline"]["rounds"] >= 1
    assert "the rounds done so far" in err and "Traceback" not in err


@pytest.mark.slow
def test_receiving_round_sets_file_system_for_that_round_only(tmp_path: Path) -> None:
    """The receiving kind of dataloader-starvation: one round with torch's file_system sharing
    strategy beside the baseline, on a real script with 2 workers that prints the strategy of
    its own process and of the worker that made its first batch."""
    folder = tmp_path / "run"
    folder.mkdir()
    write_meta(RunMeta(argv=[SHARING, "40"], cwd=str(ROOT), cpu_count=2, wall_time_s=5.0,
                       dataloaders=[DataLoaderInfo(num_workers=2)]), folder)
    trial = Trial(TryOptions(run=folder, fixes=["dataloader-starvation"], rounds=1, steps=12),
                  load_run(folder))
    trial.kind = {"dataloader-starvation": "receiving"}  # no trace here: the diagnosis' kind
    trial.plan()
    assert trial.execute() == 0
    # try.log: "===== NAME: command" then that round's output, per process
    printed = {}
    for part in (folder / "try.log").read_text().split("\n===== ")[1:]:
        name = part.split(":", 1)[0]
        printed[name] = [ln for ln in part.splitlines() if ln.startswith("sharing strategy:")]
    default = torch.multiprocessing.get_sharing_strategy()
    assert default != "file_system"  # Linux: file_descriptor, the hand-shake per tensor
    unchanged = [f"sharing strategy: main={default} worker={default}"]
    assert printed.pop("baseline") == unchanged
    # measured beside a baseline process, the two taking turns (tryfix/turns), each its own part
    variant = "dataloader-starvation[sharing_strategy=file_system]"
    assert printed.pop(f"{variant}, the baseline taking turns") == unchanged
    assert list(printed) == [f"{variant}, the variant taking turns"]
    (fixed,) = printed.values()
    assert fixed == ["sharing strategy: main=file_system worker=file_system"]
    doc = json.loads((folder / "try.json").read_text())
    (fix,) = doc["fixes"]
    assert fix["measured_pct"] is not None, fix
    assert fix["change"].startswith('torch.multiprocessing.set_sharing_strategy("file_system")')
    assert "variants" not in fix  # no num_workers sweep


def test_default_steps_from_the_runs_own_steps():
    """The round length comes from the run's plain steps: evaluation passes and steps run with
    fewer threads (slower by design) left out, as in every other step statistic."""
    from trainprof.tryfix.plan import (
        MAX_KEPT_STEPS,
        MIN_KEPT_STEPS,
        WARMUP_STEPS,
        default_steps,
    )

    times = [0.05] * 30  # 3 s of steps at 0.05 s: 60 kept steps
    # 4 cores: rounds of 4, 3, 2 and 1 threads, three of every four steps slower.
    block = [[s, 4 - k % 4] for k, s in enumerate(range(2, 30))]
    for s, t in block:
        if t != 4:
            times[s] = 0.5
    for s in (3, 5):
        times[s] = 2.0  # evaluation passes
    meta = RunMeta(step_times_s=times, thread_steps=block, eval_steps=[3, 5])
    assert default_steps(meta) == WARMUP_STEPS + 60
    # All steps counted, the median would be 0.5 s and the rounds 36 steps (the floor: three
    # blocks of the pace's median of means).
    assert default_steps(RunMeta(step_times_s=times)) == WARMUP_STEPS + MIN_KEPT_STEPS
    # A fast step: about 3 s of it, at most MAX_KEPT_STEPS (a round of 25 kept 0.4 ms steps
    # measured a 14 % saving at +4 % [-22, +24]).
    assert default_steps(RunMeta(step_times_s=[0.01] * 30)) == WARMUP_STEPS + 300
    assert default_steps(RunMeta(step_times_s=[0.0004] * 30)) == WARMUP_STEPS + MAX_KEPT_STEPS


def test_launch_bound_measures_cuda_graphs_beside_the_default_compile_on_a_gpu() -> None:
    # The estimate is the launch gaps that CUDA graphs remove: on a GPU both modes are measured.
    assert catalog.variants_for("launch-bound", 16, True, None) == [
        {}, {"mode": catalog.REDUCE_OVERHEAD},
    ]
    assert catalog.variants_for("launch-bound", 2, False, None) == [{}]  # no graphs on a CPU
    mode = {"mode": catalog.REDUCE_OVERHEAD}
    assert "CUDA graphs" in catalog.change_text("launch-bound", mode)
    assert catalog.permanent_text("launch-bound", mode) == (
        'model = torch.compile(model, mode="reduce-overhead")'
    )
    assert catalog.permanent_text("launch-bound", {}) == "model = torch.compile(model)"


@pytest.mark.slow
def test_compile_variant_passes_its_mode_to_torch_compile() -> None:
    # On a CPU, "reduce-overhead" compiles as the default mode does (no CUDA graphs there): the
    # round runs it, and says which mode it compiled with.
    torch._dynamo.reset()
    patches, applied = Patches(), Applied()
    install([{"rule": "launch-bound", "options": {"mode": "reduce-overhead"}}], patches, applied)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        x = torch.randn(4, 8)
        want = model._call_impl(x)  # the module's own call, never compiled
        got = [model(x) for _ in range(3)]
    finally:
        patches.restore()
        torch._dynamo.reset()
    assert not applied.failed, applied.failed
    assert applied.notes == ['torch.compile (mode="reduce-overhead") on Sequential']
    assert applied.compile_steps  # dynamo compiled a graph, so the call did go through it
    for out in got:
        torch.testing.assert_close(out, want)
