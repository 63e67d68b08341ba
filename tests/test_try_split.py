"""`trainprof try`: a DataLoader worker variant that also lowers the intra-op threads is split
into the thread change's part and the workers' part (the estimate is for the latter, or for both
where the run timed its model with fewer threads), and the
cpu-bf16 variant runs a CNN channels-last, as the fix and its estimate's probe do. No timing."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from trainprof.capture.patching import Patches
from trainprof.report.tryout import render_try_markdown, render_try_text, try_html
from trainprof.runmeta import RunMeta
from trainprof.tryfix.apply import Applied, install
from trainprof.tryfix.command import Trial, TryOptions, Variant
from trainprof.tryfix.estimates import RunEstimates

RULE = "dataloader-starvation"


def _trial(base_ms: float, control_ms: float, workers_ms: float, estimate: float) -> Trial:
    """A Trial holding three rounds of each variant (no script run)."""
    t = Trial.__new__(Trial)
    t.opts, t.run, t.steps = TryOptions(run=Path(".")), Path("."), 30
    t.meta = RunMeta(argv=["train.py"])
    t.est, t.rule_fix, t.est_note, t.kind = {RULE: estimate}, {}, None, {}
    t.threads_modelled, t.basis = set(), None
    t.found = RunEstimates(est=t.est)  # no DataLoader model: the rule's estimate throughout
    t.edit, t.combined, t.combined_note = [], None, None
    t.interrupted, t.stopped, t.clocks = False, None, {"host"}
    t.script_profiler, t.redirected = {"started": set(), "unwritten": set()}, set()
    t.sources_changed = []  # the run kept no copies of its files
    t.others = []  # other processes' CPUs, per round (none: no round ran)
    t.steals = []  # the hypervisor's steal, per round (likewise)
    t.job, t.ranks = None, None  # one process, not a job
    t.base = Variant("baseline", [])
    ctl = Variant("control", [{"rule": RULE, "options": {"threads": 1, "control": True}}])
    wrk = Variant("workers", [{"rule": RULE, "options": {"num_workers": 1, "threads": 1}}])
    for v, ms in ((t.base, base_ms), (ctl, control_ms), (wrk, workers_ms)):
        v.rounds = [[ms / 1000 * (1 + 0.01 * (i % 3)) for i in range(12)] for _ in range(3)]
    t.by_rule = {RULE: [wrk, ctl]}
    return t


def test_workers_part_split_from_the_thread_change():
    # 2 threads stalled on a busy machine: 100 ms; one thread alone: 40 ms; plus a worker: 30 ms.
    doc = _trial(100.0, 40.0, 30.0, estimate=10.0).document()
    (f,) = doc["fixes"]
    assert f["measured_pct"] == 70.0
    assert f["threads_only_pct"] == 60.0
    assert f["workers_pct"] == 10.0  # (40 - 30) / 100: points of the baseline step
    lo, hi = f["workers_ci_pct"]
    assert lo <= 10.0 <= hi
    # The estimate is checked against the workers' part, not against the 70 % the threads made.
    assert f["estimate_within_target"] is True


def test_an_estimate_that_models_the_thread_change_is_checked_against_both():
    """A run that timed a copy of its model with fewer threads estimates the whole change
    (workers and threads, the finding's metrics["threads_modelled"]): try checks it against
    the whole variant and still prints the split."""
    t = _trial(100.0, 120.0, 75.0, estimate=25.0)  # one thread alone: 20 % slower
    t.threads_modelled = {RULE}
    (f,) = t.document()["fixes"]
    assert f["measured_pct"] == 25.0 and f["threads_only_pct"] == -20.0
    assert f["workers_pct"] == 45.0
    assert f["estimate_includes_threads"] is True
    assert f["estimate_within_target"] is True  # 25 against the whole 25, not the workers' 45
    t.threads_modelled = set()
    (g,) = t.document()["fixes"]
    assert g["estimate_within_target"] is False and g["estimate_includes_threads"] is False


def test_the_estimates_spread_is_shown_beside_it():
    """Where the finding gives its estimate's spread within the run, try.json and the table
    carry it beside the estimate."""
    t = _trial(100.0, 40.0, 30.0, estimate=21.9)
    (f,) = t.document()["fixes"]
    assert "estimated_spread_pct" not in f
    assert "within the run's own noise" not in render_try_text(t.document())
    t.found.spread = {RULE: [3.13, 26.91]}
    doc = t.document()
    assert doc["fixes"][0]["estimated_spread_pct"] == [3.13, 26.91]
    assert "estimated: +21.9 % (3.1-26.9 % within the run's own noise)" in render_try_text(doc)


def test_rounds_that_cannot_tell_say_how_many_could():
    """A "none" whose interval also holds the estimate: the rounds could not tell the estimate
    from 0, and try.json and the table say how many rounds could, at these rounds' spread."""
    t = _trial(100.0, 100.0, 100.0, estimate=6.0)
    t.by_rule[RULE] = t.by_rule[RULE][:1]
    wrk = t.by_rule[RULE][0]
    wrk.rounds = [[ms / 1000] * 12 for ms in (90.0, 99.0, 93.0)]  # savings 10, 1 and 7 %
    (f,) = t.document()["fixes"]
    assert f["verdict"] == "none" and f["ci_pct"][0] <= 6.0 <= f["ci_pct"][1]
    assert f["rounds_to_tell"] == 12 and "rounds_to_tell_beyond" not in f
    text = render_try_text(t.document())
    assert "these rounds cannot tell +6.0 % from 0 on this machine" in text
    assert "about 12 rounds would (--rounds 12)" in text
    cell = "none (cannot tell the estimate from 0: about 12 rounds would)"
    assert cell in render_try_markdown(t.document()) and cell in try_html(t.document())
    t.est = {RULE: 0.5}  # a tiny estimate: more rounds than worth running
    (g,) = t.document()["fixes"]
    assert g["rounds_to_tell_beyond"] is True
    assert "more than 100 rounds would be needed" in render_try_text(t.document())
    t.est = {RULE: 40.0}  # an interval that excludes the estimate: "none" says enough
    assert "rounds_to_tell" not in t.document()["fixes"][0]


def test_no_split_without_a_matching_control():
    t = _trial(100.0, 40.0, 30.0, estimate=70.0)
    t.by_rule[RULE] = t.by_rule[RULE][:1]  # the worker variant only
    (f,) = t.document()["fixes"]
    assert "workers_pct" not in f
    assert f["estimate_within_target"] is True  # 70 against the whole 70


def test_cpu_bf16_runs_a_cnn_channels_last():
    patches, applied = Patches(), Applied()
    install([{"rule": "cpu-bf16"}], patches, applied)
    try:
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 2))
        seen = []  # (dtype, channels-last) of the conv's output at each call
        model[0].register_forward_hook(lambda m, i, o: seen.append(
            (o.dtype, o.is_contiguous(memory_format=torch.channels_last))))
        x = torch.randn(2, 3, 8, 8)
        model(x)  # found during this call: the next calls are the fixed ones
        out = model(x)
    finally:
        patches.restore()
    assert seen[-1] == (torch.bfloat16, True)
    assert out.dtype == torch.float32  # back to fp32 for the loss
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert applied.notes == [
        "bf16 autocast on Sequential.forward (cpu), channels-last weights and inputs"
    ]


def test_each_worker_count_is_checked_against_its_own_estimate():
    """The sweep's best count need not be the one the diagnosis suggested (many_problems: one
    worker measured best, the estimate was for two): the row's estimate is then the model's for
    the count measured, the suggestion's beside it, and every count in the sweep carries its
    own estimate."""
    t = _trial(30.0, 36.0, 21.0, estimate=37.5)
    two = Variant("two", [{"rule": RULE, "options": {"num_workers": 2, "threads": 1}}])
    two.rounds = [[0.0225 * (1 + 0.01 * (i % 3)) for i in range(12)] for _ in range(3)]
    t.by_rule[RULE].insert(1, two)
    # The model of a 30 ms step, F = 20 ms, M = 10 ms (16 with one thread), on 2 cores.
    t.found.loader = {
        "unprofiled_step_ms": 30.0, "suggested_num_workers": 2, "cores": 2,
        "model_compute_ms": 10.0, "compute_ms_by_workers": [16.0, 16.0],
        "worker_fetch_ms": 20.0, "fetches_per_step": 1.0, "receive_ms_per_batch": 0.5,
        "worker_ms_per_batch": 1.0,
    }  # fmt: skip
    t.found.spread = {RULE: [30.0, 40.0]}  # the suggestion's spread
    t.threads_modelled = {RULE}  # M timed with one thread: checked against the whole variant
    (f,) = t.document()["fixes"]
    assert f["change"].startswith("DataLoader(num_workers=1,")  # 30 % measured against 25
    assert f["estimated_pct"] == 30.0  # one worker's rate bounds the step: (30 - 21) / 30
    assert f["suggested_estimated_pct"] == 37.5
    assert f["suggested_change"].startswith("DataLoader(num_workers=2,")
    assert "estimated_spread_pct" not in f  # the spread is the suggestion's
    assert f["verdict"] == "confirmed" and f["estimate_within_target"] is True
    by_change = {v["change"][:26]: v for v in f["variants"]}
    assert by_change["DataLoader(num_workers=1, "]["estimated_pct"] == 30.0
    assert by_change["DataLoader(num_workers=2, "]["estimated_pct"] == 37.5
    assert "estimated_pct" not in by_change["torch.set_num_threads(1) o"]  # the control
    text = render_try_text(t.document())
    assert ("estimated: +30.0 % (the diagnosis's model, for this change; it suggested "
            "num_workers=2: +37.5 %)") in text
    assert "(estimated +37.5 %, 30.0-40.0 % within the run's own noise)" in text
    # The suggestion measured best: its own estimate and spread, nothing beside them.
    two.rounds = [[0.0165 * (1 + 0.01 * (i % 3)) for i in range(12)] for _ in range(3)]
    (g,) = t.document()["fixes"]
    assert g["estimated_pct"] == 37.5 and g["estimated_spread_pct"] == [30.0, 40.0]
    assert "suggested_estimated_pct" not in g
    # With each count's spread in the finding's metrics, every count's estimate carries its own:
    # the best row and the sweep's lines; the control and the suggestion's as before.
    t.found.loader.update(saving_lo_by_workers=[2.5, 30.0], saving_hi_by_workers=[31.5, 40.0])
    two.rounds = [[0.0225 * (1 + 0.01 * (i % 3)) for i in range(12)] for _ in range(3)]
    (h,) = t.document()["fixes"]
    assert h["estimated_pct"] == 30.0 and h["estimated_spread_pct"] == [2.5, 31.5]
    by_change = {v["change"][:26]: v for v in h["variants"]}
    assert by_change["DataLoader(num_workers=1, "]["estimated_spread_pct"] == [2.5, 31.5]
    assert by_change["DataLoader(num_workers=2, "]["estimated_spread_pct"] == [30.0, 40.0]
    assert "estimated_spread_pct" not in by_change["torch.set_num_threads(1) o"]
    text = render_try_text(t.document())
    assert "(estimated +30.0 %, 2.5-31.5 % within the run's own noise)" in text


def test_all_together_says_how_it_was_estimated():
    """The estimate of all fixes together is the DataLoader model's or a sum: every rendering
    says which."""
    t = _trial(100.0, 40.0, 30.0, estimate=37.5)
    t.found.est["cpu-bf16"] = 10.0
    bf16 = {"rule": "cpu-bf16", "options": {}}
    t.combined = Variant("combined", [t.by_rule[RULE][0].specs[0], bf16])
    t.combined.rounds = [[0.025 * (1 + 0.01 * (i % 3)) for i in range(12)] for _ in range(3)]
    doc = t.document()
    assert doc["combined"]["estimated_pct"] == 47.5 and doc["combined"]["estimate_basis"] == "sum"
    for text in (render_try_text(doc), render_try_markdown(doc), try_html(doc)):
        assert "+47.5 % (the sum of the estimates)" in text
    t.found.loader = {  # one worker's rate (20 + 1 ms) bounds a 30 ms step whatever bf16 saves
        "unprofiled_step_ms": 30.0, "suggested_num_workers": 1, "cores": 2,
        "model_compute_ms": 10.0, "compute_ms_by_workers": [16.0, 16.0],
        "worker_fetch_ms": 20.0, "fetches_per_step": 1.0, "receive_ms_per_batch": 0.5,
        "worker_ms_per_batch": 1.0,
    }  # fmt: skip
    doc = t.document()
    assert doc["combined"]["estimated_pct"] == 30.0 and doc["combined"]["estimate_basis"] == "model"
    assert "+30.0 % (the DataLoader model, the other fixes' savings taken off its compute)" in (
        render_try_text(doc))


def test_the_no_workers_variant_has_no_estimate():
    """A run whose loader has workers sweeps num_workers=0 too: no finding estimates that, so
    it shows none (it showed the suggestion's, +14.1 % beside a measured -67.5 %)."""
    t = _trial(30.0, 36.0, 21.0, estimate=14.1)
    none = Variant("none", [{"rule": RULE, "options": {"num_workers": 0}}])
    none.rounds = [[0.05 * (1 + 0.01 * (i % 3)) for i in range(12)] for _ in range(3)]
    t.by_rule[RULE].append(none)
    (f,) = t.document()["fixes"]
    by_change = {v["change"]: v for v in f["variants"]}
    assert "estimated_pct" not in by_change["DataLoader(num_workers=0)"]
    assert by_change["DataLoader(num_workers=0)"]["measured_pct"] < 0
    assert f["estimated_pct"] == 14.1  # the suggestion's, measured by the worker variant
