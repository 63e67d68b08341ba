"""launch-bound on the shared GPU traces (figures measured from them) and on a real CPU run
(the framework-overhead mode); its split of the `other` idle with gpu-idle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import by_rule, context, diagnosis, only
from cpu_trace import profile_loop

from trainprof.analysis.context import Context
from trainprof.analysis.dispatch import split_other
from trainprof.analysis.ledger import ledger
from trainprof.analysis.overhead import cpu_ops
from trainprof.engine import analyze
from trainprof.rules import all_rules, causes
from trainprof.trace import intervals as iv
from trainprof.trace.load import load_trace

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
DIFF_TEST = "HolisticTraceAnalysis/trace_diff/test/test.json.gz"
CONTROL = "HolisticTraceAnalysis/trace_diff/control/control.json.gz"
ALEXNET = (
    "HolisticTraceAnalysis/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"
)
DF = "HolisticTraceAnalysis/df_index_resolver/df_index_resolver.json.gz"
NS = "HolisticTraceAnalysis/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
CPU_ONLY = "HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
MTIA = "HolisticTraceAnalysis/mtia_inference_trace/mtia_inference_rank_0.json.gz"
BERT = "TraceLens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
TIMESFORMER = "TraceLens/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz"
OWL = "TraceLens/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz"
B200 = "TraceLens/b200/eager_trace.json.gz"


def test_launch_bound_bert_small():
    d = diagnosis(BERT)
    f = d.findings[0]
    assert (f.rule, f.severity) == ("launch-bound", "high")
    m = f.metrics
    # The two syncs of the step claim only the host's few µs blocked in them (the GPU, 7 % busy,
    # is never ahead of the CPU): the idle after them is the launches'.
    assert m["idle_ms_per_step"] == pytest.approx(3.288, abs=0.002)
    assert f.est_saving_pct == pytest.approx(74.3, abs=0.1)
    assert m["kernels_per_step"] == 60
    assert (m["median_kernel_us"], m["median_launch_us"]) == (
        pytest.approx(4.64, abs=0.01),
        pytest.approx(4.93, abs=0.01),
    )
    assert m["short_kernel_share"] == pytest.approx(0.65, abs=0.005)
    assert m["median_launch_delay_us"] == pytest.approx(1.67, abs=0.01)
    assert 'mode="reduce-overhead"' in f.fix and "torch.compile(model)" in f.fix


def test_launch_bound_already_compiled_step_gets_cuda_graphs():
    f = only(diagnosis(DF), "launch-bound")
    assert f.fix.startswith("The step is already compiled")
    assert f.metrics["kernels_per_step"] == 3874
    assert f.severity == "high"


@pytest.mark.parametrize("rel", [TIMESFORMER, NS, DIFF_TEST, OWL, CPU_ONLY, MTIA])
def test_launch_bound_silent(rel):
    assert not by_rule(diagnosis(rel), "launch-bound")


@pytest.mark.parametrize("rel", [NW0, BERT, TIMESFORMER, DF, CONTROL, ALEXNET, B200])
def test_launch_bound_and_gpu_idle_split_other_without_overlap(rel):
    ctx = context(rel)
    other = ctx.attribution["other"]
    s = split_other(ctx)
    assert iv.total(iv.intersect(s.launch, s.host)) == 0
    assert iv.total(s.launch) + iv.total(s.host) == pytest.approx(iv.total(other), rel=1e-9)
    # Idle that cause-specific rules claimed (optimizer loops, zero_grad, recompiles, ...) is
    # left out of launch-bound and gpu-idle: together they never exceed `other`.
    fresh = Context(ctx.trace, causes=causes())
    found = [f for r in all_rules() for f in r.check(fresh)]
    claimed = iv.total(ledger(fresh).explained)
    mine = sum(f.est_saving_ms_per_step for f in found if f.rule in ("launch-bound", "gpu-idle"))
    assert mine + fresh.per_step(claimed) / 1000 <= fresh.per_step(iv.total(other)) / 1000 + 1e-3


# ---- a real CPU run: framework overhead ---------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    path = tmp_path_factory.mktemp("cpu_runs") / "tiny.json"
    return analyze(load_trace(profile_loop(path, model, torch.randn(1, 16), torch.randn(1, 4))))


def test_cpu_run_tiny_model_framework_overhead_is_low_without_saving(tiny):
    d = tiny
    assert d.device.kind == "cpu"
    f = only(d, "launch-bound")
    assert (f.severity, f.est_saving_ms_per_step) == ("low", 0.0)
    # forward, loss, backward and zero_grad, top level; SGD's 4 per-parameter updates run inside
    # optimizer.step(): optimizer-foreach's, left out
    assert f.metrics["ops_per_step"] == 16 and f.metrics["ops_left_out_per_step"] == 4
    assert f.metrics["median_op_us"] < 20 and f.metrics["us_per_op"] <= 100
    assert not by_rule(diagnosis(CPU_ONLY), "launch-bound")  # 346 ops in a 257 ms step


# ---- a hand-written CPU trace: whose tiny ops they are -------------------------------------------
FETCH = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _cpu_steps(tmp_path: Path, span: str | None) -> Context:
    """Three 1000 µs steps: 100 ops of 2 µs (inside `span` when given), then 5 model ops of
    30 µs."""
    def ev(name: str, ts: float, dur: float, cat: str = "cpu_op") -> dict:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}

    events = []
    for k in range(3):
        t0 = 1000.0 * k
        events.append(ev(f"ProfilerStep#{k}", t0, 1000, "user_annotation"))
        if span is not None:
            events.append(ev(span, t0 + 1, 800, "user_annotation"))
        events += [ev("aten::select", t0 + 2 + 7 * i, 2) for i in range(100)]
        events += [ev("aten::addmm", t0 + 820 + 35 * i, 30) for i in range(5)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return Context(load_trace(path), causes=causes())


def _launch_bound(ctx: Context) -> list:
    return [f for r in all_rules() if r.id == "launch-bound" for f in r.check(ctx)]


def test_cpu_tiny_ops_of_the_loop_are_framework_overhead_without_saving(tmp_path: Path) -> None:
    (f,) = _launch_bound(_cpu_steps(tmp_path, None))
    assert (f.severity, f.est_saving_ms_per_step) == ("low", 0.0)
    assert f.metrics["ops_per_step"] == 105 and f.metrics["ops_left_out_per_step"] == 0
    assert "No saving is claimed" in f.evidence and "--fix launch-bound" in f.fix
    assert f.metrics["kind"] == "cpu-overhead"


def test_try_shows_the_cpu_finding_as_not_estimated(tmp_path: Path) -> None:
    """No saving claimed is no estimate of 0: `trainprof try --fix launch-bound` measures
    torch.compile beside "not estimated" (the Hugging Face example: +8.5 % measured on a CPU,
    shown before as estimated +0.0 %)."""
    from trainprof.runmeta import RunMeta, write_meta
    from trainprof.tryfix.command import Trial, TryOptions

    _cpu_steps(tmp_path, None)
    meta = RunMeta(argv=["train.py"], cwd=str(tmp_path), cpu_count=2)
    write_meta(meta, tmp_path)
    trial = Trial(TryOptions(run=tmp_path, fixes=["launch-bound"]), meta)
    trial.plan()
    (entry,) = trial.document()["fixes"]
    assert entry["rule"] == "launch-bound" and entry["estimated_pct"] is None
    assert entry["estimate_note"].startswith("not estimated: on a CPU run")


@pytest.mark.parametrize("span", [FETCH, "Optimizer.step#SGD.step"])
def test_cpu_tiny_ops_in_fetches_and_optimizer_steps_are_not_launch_bound(
    tmp_path: Path, span: str
) -> None:
    # The same 100 tiny ops per step inside a DataLoader fetch (per-sample transforms with
    # num_workers=0) or an optimizer step: dataloader-starvation's or optimizer-foreach's, and
    # torch.compile of the model cannot remove them. What is left is 5 ops of 30 µs: no finding.
    ctx = _cpu_steps(tmp_path, span)
    assert _launch_bound(ctx) == []
    c = cpu_ops(ctx)
    assert c is not None and (c.per_step, c.left_out, c.median_op_us) == (5, 100, 30)
