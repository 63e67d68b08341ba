"""`trainprof try` against the machine's speed during the run (tryfix/machine): the reference
timed at the step boundaries of the run and of the baseline's rounds, and what `try` says."""

from __future__ import annotations

from trainprof.report.tryout import machine_text, render_try_markdown, render_try_text, try_html
from trainprof.tryfix.machine import compare

FAST, SLOW = 0.000100, 0.000160  # s: this VM's two speeds, the reference's medians


def test_rounds_at_the_runs_speed_are_not_flagged() -> None:
    run = [FAST * (1 + 0.01 * (i % 3)) for i in range(30)]
    m = compare(run, [FAST * 1.03] * 10)
    assert m is not None and not m["moved"]
    assert m["run_ref_ms"] == 0.101 and m["rounds_ref_ms"] == 0.103
    assert m["ratio"] == 1.02  # outside the run's narrow range, but within the tolerance


def test_rounds_at_another_speed_are_flagged_either_way() -> None:
    fast_run = [FAST * (1 + 0.01 * (i % 3)) for i in range(30)]
    slow = compare(fast_run, [SLOW] * 10)
    assert slow is not None and slow["moved"] and slow["ratio"] > 1.5
    fast = compare([SLOW] * 30, [FAST] * 10)
    assert fast is not None and fast["moved"] and fast["ratio"] < 0.7


def test_a_run_that_saw_both_speeds_flags_neither() -> None:
    mixed = [FAST] * 15 + [SLOW] * 15
    for here in (FAST, SLOW):
        m = compare(mixed, [here] * 10)
        assert m is not None and not m["moved"]


def test_a_run_mostly_at_one_speed_is_set_against_it() -> None:
    """The Hugging Face Trainer's run in one benchmark: references 0.105-0.183 ms, median 0.166
    (most steps slow), rounds at 0.106: inside the range, but the estimates were made at the
    slow speed (0.64x)."""
    run = [FAST] * 6 + [SLOW] * 24
    m = compare(run, [FAST * 1.05] * 10)
    assert m is not None and m["moved"] and m["ratio"] < 0.7
    assert m["run_ref_range_ms"][0] <= m["rounds_ref_ms"]  # inside the range
    lines = machine_text({"machine": m})
    assert "0.105 ms against the run's typical 0.160 ms" in lines[1]
    assert not compare(run, [SLOW * 0.9] * 10)["moved"]  # 0.9x: that speed, near enough


def test_nothing_timed_gives_nothing() -> None:
    assert compare([], [FAST]) is None and compare([FAST], []) is None


def _doc(moved: bool, basis: str = "unprofiled") -> dict:
    machine = compare([FAST] * 30, [SLOW if moved else FAST] * 10)
    return {"schema": 1, "baseline": {"rounds": 3, "median_ms": 12.0}, "steps_per_round": 40,
            "warmup_steps_discarded": 5, "block_steps": 12, "fixes": [], "combined": None,
            "machine": machine, "run_step_ms": 10.0, "run_step_basis": basis}


def test_try_says_the_speeds_and_warns_where_the_machine_moved() -> None:
    quiet = machine_text(_doc(moved=False))
    assert quiet == ["a fixed piece of work between steps took 0.100 ms in the baseline's "
                     "rounds, 0.100 ms in the run (1.00x); the baseline's step 12.00 ms, the "
                     "run's 10.00 ms without the profiler, the estimates' basis (1.20x)"]
    moved = machine_text(_doc(moved=True))
    assert len(moved) == 2 and "(1.60x)" in moved[0]
    assert moved[1].startswith("the rounds saw the machine slower than the run did")
    doc = _doc(moved=True)
    text = render_try_text(doc)
    assert "machine: a fixed piece" in text and "note: the rounds saw the machine slower" in text
    assert "the rounds saw the machine slower" in render_try_markdown(doc)
    assert "the rounds saw the machine slower" in try_html(doc)


def test_a_profiled_basis_is_not_set_against_the_rounds() -> None:
    # A run without unprofiled steps: its estimates are shares of the profiled step, which the
    # profiler slows; the rounds run without it.
    lines = machine_text(_doc(moved=False, basis="profiled"))
    assert len(lines) == 1 and "the run's 10.00 ms" not in lines[0]


def test_older_try_files_show_no_machine_line() -> None:
    assert machine_text({"baseline": {"median_ms": 12.0}}) == []


def test_a_run_under_other_load_is_flagged_against_quiet_rounds() -> None:
    """bench2's try_mlp: 0.56 CPUs of 2 busy elsewhere during the run, none in the rounds, the
    reference 0.81x (not moved): the fused-Adam estimate was made on a busier machine."""
    run = [FAST] * 30
    m = compare(run, [FAST * 0.95] * 10, 0.559, [0.02, 0.01, 0.03, 0.0], cpus=2)
    assert m is not None and not m["moved"] and m["load_differs"]
    assert m["run_other_cpus"] == 0.559 and m["rounds_other_cpus"] == 0.015 and m["cpus"] == 2
    lines = machine_text({"machine": m})
    assert len(lines) == 2
    assert lines[1].startswith("other processes kept 0.56 of 2 CPUs busy during the run, "
                               "0.01 during the rounds: the estimates were made on a busier")
    # The same load either side, or a tenth of a core apart: not flagged.
    same = compare(run, [FAST] * 10, 0.3, [0.25, 0.35], cpus=2)
    assert same is not None and not same["load_differs"]
    assert len(machine_text({"machine": same})) == 1
    # On 16 CPUs, 1.6 CPUs is the least that counts (10 %): 1.0 apart is not enough.
    assert not compare(run, [FAST] * 10, 1.0, [0.0], cpus=16)["load_differs"]
    assert compare(run, [FAST] * 10, 2.0, [0.0], cpus=16)["load_differs"]


def test_rounds_the_hypervisor_held_less_than_the_run_are_flagged() -> None:
    """A try_fakedata run with 28 % of its CPU time stolen (146 ms a step) and rounds with none
    (73 ms), the reference 1.01x: the steal says what the reference missed."""
    run = [FAST] * 30
    m = compare(run, [FAST * 1.01] * 10, 0.02, [0.0], 2, 0.276, [0.002, 0.0, 0.004])
    assert m is not None and not m["moved"] and not m["load_differs"] and m["steal_differs"]
    assert m["run_steal_share"] == 0.276 and m["rounds_steal_share"] == 0.002
    lines = machine_text({"machine": m})
    assert len(lines) == 2
    assert lines[1].startswith("the hypervisor held the CPUs for 28 % of the time they wanted to "
                               "run during the run, 0 % during the rounds")
    assert "the estimates were made on a busier host" in lines[1]
    # Apart by a tenth or less, or not known for the run (older metadata): no sentence.
    near = compare(run, [FAST] * 10, 0.0, [0.0], 2, 0.15, [0.06])
    assert near is not None and not near["steal_differs"]
    assert "run_steal_share" not in compare(run, [FAST] * 10, 0.0, [0.0], 2, None, [0.3])
    assert len(machine_text({"machine": near})) == 1


def test_load_without_the_reference_still_compares() -> None:
    """A GPU run times no reference, but its load is known."""
    m = compare([], [], 0.0, [1.5], cpus=2)
    assert m == {"run_other_cpus": 0.0, "rounds_other_cpus": 1.5, "cpus": 2,
                 "load_differs": True}
    assert machine_text({"machine": m})[0].startswith(
        "other processes kept 0.00 of 2 CPUs busy during the run, 1.50 during the rounds: "
        "the estimates were made on a quieter machine")
    assert compare([], [], None, [1.0]) is None and compare([], [], 0.5, []) is None
