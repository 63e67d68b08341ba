"""`trainprof try`'s rounds of turns (tryfix/turns): a fix that changes the process, run in a
process beside the baseline's, the two taking turns in blocks of steps, each stopped with its
helper processes while the other runs. The schedule and the pairs, the turns themselves on two
real processes, and real rounds of a DataLoader fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from test_run_cli import ROOT, SCRIPTS, trainprof

from trainprof.runmeta import DataLoaderInfo, RunMeta, read_meta, write_meta
from trainprof.tryfix import turns
from trainprof.tryfix.command import Trial, TryOptions
from trainprof.tryfix.plan import script_end
from trainprof.tryfix.switch import TRANSITION

STARVED = str(SCRIPTS / "try_turns.py")


# ----- the schedule and the pairs ----------------------------------------------------------------
def test_schedule_is_abba_cycles_and_each_process_runs_half() -> None:
    assert turns.schedule(2, 0) == [0, 1, 1, 0] * 2
    assert turns.schedule(1, 1) == [1, 0, 0, 1]  # every other round: BAAB
    assert turns.cycles_for(kept=25, block=12) == 2  # 4 blocks a cycle, 2 a side: 24 steps
    assert turns.cycles_for(kept=1, block=12) == 1
    # warm-up, 4 blocks of its own of 1 + 12 steps, and one after the last report
    assert turns.own_blocks(turns.schedule(2, 0), 1) == 4
    assert turns.own_steps(blocks=4, block=12, warmup=5) == 5 + 4 * 13 + 1


def test_variants_sharing_a_baseline_each_take_turns_with_it() -> None:
    """Three variants beside one baseline process: each cycle runs ABBA with each variant in
    turn, so every variant block is next to a baseline block, and the baseline runs two blocks
    for each variant."""
    sides = turns.schedule(2, 0, variants=3)
    assert sides[:12] == [0, 1, 1, 0, 0, 2, 2, 0, 0, 3, 3, 0] and sides[12:] == sides[:12]
    assert turns.schedule(1, 1, variants=2) == [1, 0, 0, 1, 2, 0, 0, 2]
    assert [turns.own_blocks(sides, i) for i in range(4)] == [12, 4, 4, 4]


def test_split_pairs_each_processs_blocks_in_the_order_they_ran() -> None:
    warmup, block = 2, 2
    sides = turns.schedule(2, 0)  # off on on off off on on off: 4 blocks each
    n = turns.own_steps(4, block, warmup)
    base = [float(s) for s in range(n)]  # a step's time is its index, the variant's + 100
    variant = [100.0 + s for s in range(n)]
    ((off, on),) = turns.split([base, variant], sides, warmup, block, [set(), set()])
    # each block without its first step: the baseline's own blocks 0..3 are global blocks
    # 0, 3, 4, 7; the variant's 1, 2, 5, 6. Pairs (0, 1), (2, 3), (4, 5), (6, 7).
    assert off == [3.0, 4.0, 6.0, 7.0, 9.0, 10.0, 12.0, 13.0]
    assert on == [103.0, 104.0, 106.0, 107.0, 109.0, 110.0, 112.0, 113.0]
    # A bad step (an evaluation pass) in the variant's second block drops pair (2, 3) whole.
    ((off, on),) = turns.split([base, variant], sides, warmup, block, [set(), {7}])
    assert off == [3.0, 4.0, 9.0, 10.0, 12.0, 13.0] and len(on) == len(off)
    # A process that ended early: the pairs it did not finish are left out.
    ((off, on),) = turns.split([base[:8], variant], sides, warmup, block, [set(), set()])
    assert off == [3.0, 4.0, 6.0, 7.0] and on == [103.0, 104.0, 106.0, 107.0]


def test_split_gives_each_variant_the_baseline_blocks_next_to_its_own() -> None:
    warmup, block = 1, 1
    sides = turns.schedule(1, 0, variants=2)  # 0 1 1 0 0 2 2 0
    times = [[float(s) for s in range(20)], [100.0 + s for s in range(20)],
             [200.0 + s for s in range(20)]]
    (off1, on1), (off2, on2) = turns.split(times, sides, warmup, block, [set(), set(), set()])
    # blocks of 2 steps, the first not timed: the baseline's own blocks 0..3 are global blocks
    # 0, 3, 4, 7 (timed steps 2, 4, 6, 8); each variant's 0 and 1 (timed steps 2 and 4)
    assert (off1, on1) == ([2.0, 4.0], [102.0, 104.0])
    assert (off2, on2) == ([6.0, 8.0], [202.0, 204.0])
    # Variant 1 stopped after its first block: its second never ran, and the blocks that did
    # are still paired as they ran (the baseline's two blocks in a row are no pair).
    ran = [0, 1, 0, 0, 2, 2, 0]
    (off1, on1), (off2, on2) = turns.split(times, ran, warmup, block, [set(), set(), set()])
    assert (off1, on1) == ([2.0], [102.0]) and (off2, on2) == ([6.0, 8.0], [202.0, 204.0])


# ----- the turns, on real processes ------------------------------------------------------------
def _times(path: Path) -> list[float]:
    return [float(x) for x in path.read_text().split()] if path.exists() else []


def _child(tmp_path: Path, name: str, block: int, steps: int) -> tuple[subprocess.Popen, int,
                                                                        int, Path]:
    """A turns_child.py process: (it, the write end of its go pipe, the read end of its done
    pipe, its output's stem)."""
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    out = tmp_path / name
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "turns_child.py"), str(go_r), str(done_w), str(block),
         str(steps), str(out)], env=dict(os.environ, PYTHONPATH=str(ROOT)),
        pass_fds=(go_r, done_w))
    os.close(go_r)
    os.close(done_w)
    return proc, go_w, done_r, out


def test_each_process_and_its_helpers_stand_still_while_another_runs(tmp_path: Path) -> None:
    """A baseline and two variants, each with a helper process writing the time every 2 ms:
    during each block of steps of one, the others and their helpers write nothing."""
    block, cycles = 4, 2
    sides = turns.schedule(cycles, 0, variants=2)
    steps = [turns.own_steps(turns.own_blocks(sides, i), block, warmup=2) for i in range(3)]
    kids = [_child(tmp_path, f"side{i}", block, steps[i]) for i in range(3)]
    procs, outs = [k[0] for k in kids], [k[3] for k in kids]
    group = turns.Group([p.pid for p in procs], [k[1] for k in kids], [k[2] for k in kids])
    assert group.take_turns(sides, time.monotonic() + 60) == (sides, {})
    assert [p.wait(timeout=30) for p in procs] == [0, 0, 0]
    ends = [_times(o.with_suffix(".steps")) for o in outs]
    ticks = [_times(o.with_suffix(".ticks")) for o in outs]
    assert [len(e) for e in ends] == steps
    assert all(len(t) > 20 for t in ticks)  # the helpers ran, between their turns
    own = [0, 0, 0]
    spans = []
    for i in sides:
        first = 2 + own[i] * (TRANSITION + block)  # the block's first step
        own[i] += 1
        # from the block's first step's start (its end less the 3 ms of work) to its last's end
        start, end = ends[i][first] - 0.003, ends[i][first + TRANSITION + block - 1]
        spans.append((start, end))
        for other in {0, 1, 2} - {i}:
            inside = [t for t in ends[other] + ticks[other] if start < t < end]
            assert inside == [], f"process {other} ran during a block of process {i}"
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))  # in order


def _gone(tmp_path: Path) -> tuple[subprocess.Popen, int, int]:
    """A process that ends without a report, leaving behind a process of its own that holds its
    pipe open (forked: it inherits every descriptor)."""
    gone_r, gone_w = os.pipe()
    dead_r, dead_w = os.pipe()
    gone = subprocess.Popen(
        [sys.executable, "-c", "import os, sys, time\nif os.fork() == 0: time.sleep(20)"],
        pass_fds=(gone_r, dead_w), stdout=subprocess.PIPE)
    os.close(gone_r)
    os.close(dead_w)
    return gone, gone_w, dead_r


def test_a_variant_that_ends_early_stops_the_turns_and_leaves_the_other_running(
    tmp_path: Path,
) -> None:
    live, go_w, done_r, _ = _child(tmp_path, "live", 4, 40)
    gone, gone_w, dead_r = _gone(tmp_path)
    group = turns.Group([live.pid, gone.pid], [go_w, gone_w], [done_r, dead_r])
    start = time.monotonic()
    ran, why = group.take_turns(turns.schedule(1, 0), start + 60)
    assert why == {1: "the variant's process ended before its turns did"} and ran == []
    assert time.monotonic() - start < 15  # its end is seen, not the deadline's 60 s
    assert live.wait(timeout=30) == 0  # released: not left stopped, not waiting for a word
    assert gone.wait(timeout=5) == 0


def test_a_variant_that_ends_early_leaves_the_others_their_turns(tmp_path: Path) -> None:
    block = 4
    sides = turns.schedule(1, 0, variants=2)  # 0 1 1 0 0 2 2 0
    base, go0, done0, _ = _child(tmp_path, "base", block,
                                 turns.own_steps(turns.own_blocks(sides, 0), block, 2))
    other, go2, done2, _ = _child(tmp_path, "other", block,
                                  turns.own_steps(turns.own_blocks(sides, 2), block, 2))
    gone, gone_w, dead_r = _gone(tmp_path)
    group = turns.Group([base.pid, gone.pid, other.pid], [go0, gone_w, go2],
                        [done0, dead_r, done2])
    ran, why = group.take_turns(sides, time.monotonic() + 60)
    assert why == {1: "variant 1's process ended before its turns did"}
    assert ran == [0, 0, 0, 2, 2, 0]
    assert base.wait(timeout=30) == 0 and other.wait(timeout=30) == 0
    assert gone.wait(timeout=5) == 0


# ----- which variants share a baseline process ---------------------------------------------------
@pytest.mark.parametrize("devices", [[], ["cuda:0"]])
def test_a_fixs_variants_share_one_baseline_process_on_a_cpu_run(
    tmp_path: Path, devices: list[str]
) -> None:
    """The DataLoader sweep of a 2-core CPU run (two worker counts and the thread-only control)
    is one round of turns: four processes, not six. On a GPU each process holds its device
    memory: each variant beside a baseline of its own."""
    folder = tmp_path / "run"
    folder.mkdir()
    write_meta(RunMeta(argv=[STARVED], cwd=str(ROOT), cpu_count=2, wall_time_s=5.0,
                       devices=devices, step_times_s=[0.021] * 20, max_steps=20,
                       dataloaders=[DataLoaderInfo(num_workers=0)]), folder)
    trial = Trial(TryOptions(run=folder, fixes=["dataloader-starvation"]), read_meta(folder))
    trial.plan()
    todo = trial.active()
    assert len(todo) >= 2 and all(v.turns for v in todo)
    if devices:
        assert [len(u) for u in trial.units(todo)] == [1] * len(todo)
        return
    assert len(todo) == 3 and [len(u) for u in trial.units(todo)] == [3]
    todo[0].alone = True  # its shared round failed: a baseline of its own from then on
    assert sorted(len(u) for u in trial.units(todo)) == [1, 2]


@pytest.mark.parametrize("steps", [40, 20000])
def test_a_script_that_ends_before_a_shared_baseline_does_not_share_one(
    tmp_path: Path, steps: int
) -> None:
    """The Hugging Face example ends after 40 steps: a baseline process shared by the DataLoader
    sweep's three variants ended in the first one's blocks, and the other two were not measured
    ("too few for a block"). Each runs beside a baseline of its own there; a script that runs
    long enough shares one; a run `--max-steps` ended says nothing of the script's end."""
    base = RunMeta(argv=[STARVED], cwd=str(ROOT), cpu_count=2, wall_time_s=5.0,
                   step_times_s=[0.021] * steps, dataloaders=[DataLoaderInfo(num_workers=0)])
    trial = Trial(TryOptions(run=tmp_path, fixes=["dataloader-starvation"]), base)
    write_meta(base, tmp_path)
    trial.plan()
    todo = trial.active()
    assert len(todo) == 3
    fits = steps >= trial.shared_steps(3)
    assert trial.shared_steps(1) < 20000 and (fits == (steps == 20000))
    assert script_end(base) == steps
    assert [len(u) for u in trial.units(todo)] == ([3] if fits else [1, 1, 1])
    for stopped in (RunMeta(**{**msgspec.structs.asdict(base), "max_steps": steps}),
                    RunMeta(**{**msgspec.structs.asdict(base),
                               "notes": [f"stopped by --max-steps after {steps} steps"]})):
        assert script_end(stopped) is None
        trial.meta = stopped
        assert [len(u) for u in trial.units(todo)] == [3]


# ----- real rounds -------------------------------------------------------------------------------
def _starved(folder: Path, *args: str) -> Path:
    """A run of the script stopped by --max-steps after 20 steps: it runs longer in the rounds."""
    folder.mkdir()
    write_meta(RunMeta(argv=[STARVED, *args], cwd=str(ROOT), cpu_count=2, wall_time_s=5.0,
                       step_times_s=[0.021] * 20, max_steps=20,
                       dataloaders=[DataLoaderInfo(num_workers=0)]),
               folder)
    return folder


@pytest.mark.slow
def test_workers_measured_in_turns_beside_the_baseline(tmp_path: Path) -> None:
    """Each sample sleeps 5 ms in the dataset: two workers fetch side by side and halve the
    step, one does not; measured in rounds of turns, the best variant is two workers."""
    folder = _starved(tmp_path / "run", "400")
    tmp = tmp_path / "tmp"  # the rounds' temporary files, their workers' included
    tmp.mkdir()
    done = trainprof("try", str(folder), "--fix", "dataloader-starvation", "--rounds", "1",
                     "--steps", "30", env={**os.environ, "TMPDIR": str(tmp)})
    assert done.returncode == 0, done.stderr
    # The fix's persistent workers stopped with their round: none left a folder behind
    # (multiprocessing's exit handler terminated them, each leaving one, before)
    assert not list(tmp.glob("pymp-*"))
    doc = json.loads((folder / "try.json").read_text())
    (fix,) = doc["fixes"]
    # 0.25 s of the run's 21 ms steps: blocks of 12; 25 timed steps a side make 2 ABBA cycles,
    # 4 blocks of each process: 2 pairs of its own a process... 4 pairs in all, 48 steps a side
    assert doc["turns_steps_per_process"] == 5 + 4 * 13 + 1
    assert "switched_steps_per_round" not in doc
    by_change = {v["change"]: v for v in fix["variants"]}
    two = next(v for c, v in by_change.items() if "num_workers=2" in c)
    one = next(v for c, v in by_change.items() if "num_workers=1" in c)
    # the sweep (two counts and the thread-only control) beside one baseline process, each
    # paired with the baseline's blocks next to its own
    assert len(fix["variants"]) == 3
    for v in fix["variants"]:
        assert sorted(v["turns"]["baseline_shared_with"]) == sorted(
            x["change"] for x in fix["variants"] if x is not v)
    assert "share one baseline process" in done.stderr
    assert "the baseline's process shared with 2 other variant(s)" in done.stdout
    assert two["turns"]["without_step_times_ms"] != one["turns"]["without_step_times_ms"]
    for v in (two, one):
        assert v["turns"]["block_steps"] == 12 and v["turns"]["transition_steps"] == 1
        assert [len(r) for r in v["step_times_ms"]] == [48]
        assert [len(r) for r in v["turns"]["without_step_times_ms"]] == [48]
        # the baseline's process: no workers, 4 samples of 5 ms a step
        assert min(v["turns"]["without_step_times_ms"][0]) >= 20.0
    assert two["measured_pct"] > 30.0 and two["ci_pct"][0] > 0.0
    assert two["measured_pct"] > one["measured_pct"] + 20.0
    assert fix["measured_pct"] == two["measured_pct"]
    assert "taking turns" in done.stdout and "taking turns" in done.stderr
    # the workers' part against the thread change alone, each beside its own baseline
    assert fix["workers_pct"] == pytest.approx(two["measured_pct"] - fix["threads_only_pct"],
                                               abs=0.11)


@pytest.mark.slow
def test_a_script_that_cannot_run_twice_at_once_is_measured_in_rounds_of_its_own(
    tmp_path: Path,
) -> None:
    """The script binds a fixed port, as one with a hard-coded MASTER_PORT: the variant's
    process beside the baseline's fails to start, and the fix falls back to rounds of its own,
    which measure it and say why."""
    folder = _starved(tmp_path / "run", "60", "--bind")
    done = trainprof("try", str(folder), "--fix", "dataloader-starvation", "--rounds", "1",
                     "--steps", "20")
    assert done.returncode == 0, done.stderr
    doc = json.loads((folder / "try.json").read_text())
    (fix,) = doc["fixes"]
    for v in fix["variants"]:
        assert "turns" not in v and v["measured_pct"] is not None
    assert any("measured in rounds of its own" in n and "Address already in use" in n
               for n in fix["notes"])
    # first beside the baseline process the sweep shared, then beside one of its own
    assert any("beside a baseline process of its own" in n for n in fix["notes"])
    assert "turns_steps_per_process" not in doc


@pytest.mark.slow
def test_fixes_together_take_turns_with_a_baseline_of_their_own(tmp_path: Path) -> None:
    """Two fixes that each save (the workers, and set_to_none against a 10 ms sleep when the
    gradients were left in place): measured together in turns too, without more rounds of the
    baseline alone."""
    folder = _starved(tmp_path / "run", "400", "--grads")
    done = trainprof("try", str(folder), "--fix", "dataloader-starvation", "--fix",
                     "zero-grad-not-none", "--rounds", "1", "--steps", "20")
    assert done.returncode == 0, done.stderr
    doc = json.loads((folder / "try.json").read_text())
    by_rule = {f["rule"]: f for f in doc["fixes"]}
    assert "switched" in by_rule["zero-grad-not-none"]  # a flag: switched in one process
    assert by_rule["zero-grad-not-none"]["ci_pct"][0] > 0
    combined = doc["combined"]
    assert combined["rules"] == ["dataloader-starvation", "zero-grad-not-none"]
    assert combined["turns"]["block_steps"] == 12  # as every fix's: 0.25 s of the run's step
    assert combined["measured_pct"] > by_rule["zero-grad-not-none"]["measured_pct"]
    assert combined["estimated_pct"] is None and "estimate_basis" not in combined  # no trace
    assert doc["baseline"]["rounds"] == 1  # the combined round's baseline ran beside it
