"""`trainprof try`'s rounds that switch a fix off and on between steps (tryfix/switch): the
schedule, how a round's steps are paired, the statistic, each switchable fix turned off and on
in this process, and real rounds of a script whose step shows which side it ran."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from test_run_cli import SCRIPTS, trainprof
from torch import nn

from trainprof.capture.patching import Patches
from trainprof.runmeta import DataLoaderInfo, RunMeta, write_meta
from trainprof.tryfix import catalog, switch
from trainprof.tryfix.apply import Applied, install
from trainprof.tryfix.command import Trial, TryOptions
from trainprof.tryfix.measure import saving, switched_rounds_to_tell, switched_saving

SENSOR = str(SCRIPTS / "try_switch.py")


# ----- the schedule and the pairs ----------------------------------------------------------------
def test_blocks_run_abba_after_a_warm_up_on_the_first_blocks_side() -> None:
    sides = [switch.side(s, warmup=2, block=2, parity=0) for s in range(2 + 4 * 3)]
    # warm-up (2), then blocks of 1 + 2 steps: off, on, on, off
    assert sides == [False] * 2 + [False] * 3 + [True] * 3 + [True] * 3 + [False] * 3
    flipped = [switch.side(s, warmup=2, block=2, parity=1) for s in range(14)]
    assert flipped == [not s for s in sides]  # the next round starts with the fix on: BAAB
    # Whole ABBA cycles holding about `kept` timed steps on each side.
    assert switch.steps_for(kept=10, block=4, warmup=5) == 5 + 2 * 4 * 5
    assert switch.steps_for(kept=1, block=4, warmup=5) == 5 + 4 * 5


def test_split_pairs_adjacent_blocks_and_drops_transitions_and_whole_pairs() -> None:
    warmup, block = 2, 2
    on = [switch.side(s, warmup, block, 0) for s in range(2 + 4 * 3 + 2)]  # 2 steps past the end
    times = [float(s) for s in range(len(on))]  # a step's time is its index
    off, with_fix = switch.split(times, on, warmup, warmup, set(), block)
    # pairs (blocks 0 and 1, 2 and 3), each block without its first step; the steps after the
    # last whole pair are left out
    assert off == [3.0, 4.0, 12.0, 13.0] and with_fix == [6.0, 7.0, 9.0, 10.0]
    # A step to skip (an evaluation pass) drops its pair, both blocks: the lists stay aligned.
    off, with_fix = switch.split(times, on, warmup, warmup, {9}, block)
    assert off == [3.0, 4.0] and with_fix == [6.0, 7.0]
    # A pair starting before `head` (a longer warm-up) is left out whole too.
    assert switch.split(times, on, warmup, 4, set(), block) == ([12.0, 13.0], [9.0, 10.0])
    # Steps whose recorded side does not follow the schedule: no pair.
    assert switch.split(times, [False] * len(times), warmup, warmup, set(), block) == ([], [])


def test_blocks_fit_between_the_evaluation_passes_of_a_short_script(tmp_path: Path) -> None:
    """Lightning's example: 60 steps of 5.8 ms, validating at steps 20 and 40. Both pairs of
    blocks of 12 held a validation step, and `split` dropped them: nothing was timed switched.
    The switched block is the one that keeps the most steps timed there (4: five pairs); the
    turns keep theirs, and a script without evaluation passes keeps 12."""
    assert switch.clean_pairs(60, 12, 5, {20, 40}) == 0
    assert switch.clean_pairs(60, 4, 5, {20, 40}) == 5  # 20 and 40 fall on untimed transitions
    assert switch.clean_pairs(60, 12, 5, set()) == 2
    run = [0.0058] * 60
    write_meta(RunMeta(argv=[SENSOR], cwd=str(tmp_path), cpu_count=2, step_times_s=run), tmp_path)
    plain = Trial(TryOptions(run=tmp_path, fixes=["zero-grad-not-none"]),
                  RunMeta(argv=[SENSOR], step_times_s=run, cpu_count=2))
    assert plain.switched_block == plain.block == 12
    evals = Trial(TryOptions(run=tmp_path, fixes=["zero-grad-not-none"]),
                  RunMeta(argv=[SENSOR], step_times_s=run, cpu_count=2, eval_steps=[20, 40]))
    assert (evals.block, evals.switched_block) == (12, 4)
    evals.plan()
    assert evals.by_rule["zero-grad-not-none"][0].block == 4
    # the script's own 60 steps, and a 1-step run (no room at any block): unchanged
    one = RunMeta(argv=[SENSOR], step_times_s=[0.0058], cpu_count=2, eval_steps=[0])
    assert Trial(TryOptions(run=tmp_path), one).switched_block == 12


def test_switch_calls_back_only_when_it_flips() -> None:
    s = switch.Switch()
    seen: list[bool] = []
    s.when_changed(seen.append)
    assert s.on  # on by default: a round that does not alternate runs with its fixes
    s.set(True)
    s.set(False)
    s.set(False)
    s.set(True)
    assert seen == [False, True]
    done = [0]
    alt = switch.Alternation(s, lambda: done[0], warmup=1, block=1, parity=0)
    assert not s.on  # the warm-up runs with the first block's side
    for _ in range(6):
        done[0] += 1
        alt.after_step()
    assert alt.sides == [False, False, False, True, True, True]  # warm-up, then 1 + 1 per block


# ----- the statistic -----------------------------------------------------------------------------
def test_switched_saving_cancels_the_machine_moving_between_rounds_and_within_them() -> None:
    """Three rounds, each with the machine 2x slower in its second half and the rounds at
    different speeds: the fix takes 20 % off every step. Paired blocks see 20 % in each pair;
    the separate rounds' statistic, fed the same sides as if they had run apart, cannot."""
    block = 4
    rng = np.random.default_rng(1)
    base, fix = [], []
    for speed in (1.0, 1.6, 0.7):
        off, on = [], []
        for pair in range(8):
            phase = speed * (2.0 if pair >= 4 else 1.0)
            noise = rng.normal(1.0, 0.01, 2 * block)
            off += list(10.0 * phase * noise[:block])
            on += list(8.0 * phase * noise[block:])
        base.append(off)
        fix.append(on)
    m, lo, hi = switched_saving(base, fix, block)
    assert m == pytest.approx(20.0, abs=1.0) and lo <= 20.0 <= hi and hi - lo < 4.0
    # Rounds of another speed on each side (the baseline's in the slow stretch, the fix's in the
    # fast one): separate rounds read the machine, not the fix.
    m2, lo2, hi2 = saving([r[len(r) // 2:] for r in base], [r[: len(r) // 2] for r in fix], block)
    assert m2 > 50.0


def test_rounds_to_tell_a_switched_fix_scale_with_its_interval() -> None:
    # [-4, +14] around an estimate of 10 % after 3 rounds: 3 * (18 / 10) ** 2 = 9.7
    assert switched_rounds_to_tell(10.0, 3, -4.0, 14.0) == 10
    assert switched_rounds_to_tell(10.0, 3, -500.0, 500.0) == 101  # beyond what is counted
    assert switched_rounds_to_tell(0.0, 3, -4.0, 14.0) is None


# ----- which fixes are switched ------------------------------------------------------------------
def test_switchable_fixes_are_switched_unless_separate(tmp_path: Path) -> None:
    assert catalog.switchable("cpu-bf16", cuda=False) and catalog.switchable("no-amp", cuda=True)
    assert catalog.switchable("optimizer-foreach", cuda=False)
    # Adam's step counters are made on the device for fused and on the CPU otherwise: on a GPU
    # one side would run with the other's.
    assert not catalog.switchable("optimizer-foreach", cuda=True)
    assert not catalog.switchable("dataloader-starvation", cuda=False)
    assert not catalog.switchable("launch-bound", cuda=False)  # a compile is no flag
    write_meta(RunMeta(argv=[SENSOR, "zero-grad"], cwd=str(tmp_path), cpu_count=2,
                       step_times_s=[0.05] * 20), tmp_path)
    rules = ["zero-grad-not-none", "optimizer-foreach", "dataloader-starvation"]
    for separate in (False, True):
        trial = Trial(TryOptions(run=tmp_path, fixes=rules, separate=separate),
                      RunMeta(argv=[SENSOR], step_times_s=[0.05] * 20, cpu_count=2))
        trial.plan()
        blocks = {r: [v.block for v in vs] for r, vs in trial.by_rule.items()}
        # 0.25 s of 50 ms steps a block, switched in one process; the DataLoader sweep's
        # variants change the process: each in a process beside the baseline's, taking turns
        # in blocks as long (tryfix/turns); with --separate, every one in rounds of its own
        want = 0 if separate else 5
        assert blocks["zero-grad-not-none"] == [want] and blocks["optimizer-foreach"] == [want]
        assert set(blocks["dataloader-starvation"]) == {want}
        turned = {r: {v.turns for v in vs} for r, vs in trial.by_rule.items()}
        assert turned == {"zero-grad-not-none": {False}, "optimizer-foreach": {False},
                          "dataloader-starvation": {not separate}}


def test_a_cpu_loader_with_workers_takes_turns_instead(tmp_path: Path) -> None:
    """Workers make batches ahead while the slower side runs, and a switched fix's blocks
    would take them: on a CPU run whose loader has workers, every fix goes in turns (each
    process's workers stop with it), or in rounds of its own with --separate."""
    loaders = [DataLoaderInfo(num_workers=1)]
    write_meta(RunMeta(argv=[SENSOR, "zero-grad"], cwd=str(tmp_path), cpu_count=2,
                       step_times_s=[0.05] * 20, dataloaders=loaders), tmp_path)
    rules = ["zero-grad-not-none", "optimizer-foreach"]
    for separate in (False, True):
        trial = Trial(TryOptions(run=tmp_path, fixes=rules, separate=separate),
                      RunMeta(argv=[SENSOR], step_times_s=[0.05] * 20, cpu_count=2,
                              dataloaders=loaders))
        trial.plan()
        for rule in rules:
            (v,) = trial.by_rule[rule]
            assert v.turns is (not separate) and v.block == (0 if separate else 5), rule


# ----- each switchable fix, off and on in this process -----------------------------------------
def test_each_switchable_fix_follows_the_switch() -> None:
    sw = switch.Switch()
    patches, applied = Patches(), Applied()
    install([{"rule": "zero-grad-not-none"}, {"rule": "optimizer-foreach"},
             {"rule": "cpu-bf16"}], patches, applied, sw)
    try:
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
        seen = []  # autocast in the model's forward, at each call
        model[2].register_forward_hook(
            lambda m, i, o: seen.append(torch.is_autocast_enabled("cpu"))
        )
        sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(2, 3, 8, 8)

        def step() -> None:
            sgd.zero_grad(set_to_none=False)
            model(x).sum().backward()
            sgd.step()

        conv = model[0].weight
        step()  # the model is found here: autocast, channels-last weights
        assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
        assert sgd.param_groups[0]["fused"] is True and sgd.defaults["fused"] is True
        step()
        assert conv.grad is not None  # set_to_none=True, then backward made it again
        buf = sgd.state[conv]["momentum_buffer"]
        assert buf.is_contiguous(memory_format=torch.channels_last)

        sw.set(False)  # the script as it was written
        assert conv.is_contiguous()  # the layout it had, converted at the switch
        assert sgd.param_groups[0]["fused"] is None and sgd.param_groups[0]["foreach"] is None
        step()
        assert conv.grad is not None and sgd.state[conv]["momentum_buffer"].is_contiguous()
        sgd.zero_grad(set_to_none=False)  # the script's own argument
        assert conv.grad is not None and not conv.grad.any()

        sw.set(True)
        sgd.zero_grad(set_to_none=False)
        assert conv.grad is None
        step()
        assert sgd.param_groups[0]["fused"] is True and not conv.is_contiguous()
        assert sgd.state[conv]["momentum_buffer"].is_contiguous(memory_format=torch.channels_last)
        assert seen == [False, True, False, True]  # the first call found the model
        # An optimizer made while the switch is off is made with the fix (fused checked), then
        # runs as the script made it until the switch is on.
        sw.set(False)
        adam = torch.optim.Adam(model.parameters(), lr=0.1, foreach=False)
        assert adam.defaults["fused"] is None and adam.defaults["foreach"] is False
        sw.set(True)
        assert adam.defaults["fused"] is True and adam.defaults["foreach"] is False
    finally:
        patches.restore()


# ----- real rounds -------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("mode", "rule"), [("zero-grad", "zero-grad-not-none"),
                                            ("bf16", "cpu-bf16")])
def test_switched_rounds_measure_the_fix_on_the_side_that_has_it(
    tmp_path: Path, mode: str, rule: str
) -> None:
    """The script sleeps 100 ms in every step that runs without the fix: the switched rounds'
    steps without it are the slow ones, and the saving is most of the step. (20 ms, on a
    machine loaded twice over, left the fix's 0.4 ms steps paused 40-80 ms often enough to
    measure 13.6 %.)"""
    write_meta(RunMeta(argv=[SENSOR, mode, "400", "100"], cwd=str(tmp_path), cpu_count=2,
                       wall_time_s=5.0, step_times_s=[0.02] * 20), tmp_path)
    done = trainprof("try", str(tmp_path), "--fix", rule, "--rounds", "2", "--steps", "30")
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "try.json").read_text())
    (fix,) = doc["fixes"]
    sw = fix["switched"]
    assert sw["block_steps"] == 12  # 0.25 s of the run's 20 ms steps, at most 12
    # 2 rounds, each 5 + 2 ABBA cycles of 4 blocks of 1 + 12 steps (25 timed steps a side, as
    # --steps 30 keeps in a round of its own, rounded up to whole cycles): 4 pairs a round
    assert [len(r) for r in fix["step_times_ms"]] == [48, 48]
    assert [len(r) for r in sw["without_step_times_ms"]] == [48, 48]
    assert min(min(r) for r in sw["without_step_times_ms"]) >= 100.0  # every step slept
    assert sw["without_median_ms"] > fix["median_ms"] + 50.0
    assert fix["measured_pct"] > 50.0 and fix["ci_pct"][0] > 0.0
    assert doc["baseline"]["rounds"] == 2 and fix["rounds"] == 2
    assert "switched in blocks" in done.stdout
    # After the first round, how long the rest will take, from how long it took.
    assert re.search(r"1 of 2 rounds done; about \d+ s for the rest\n", done.stderr)
