"""launch-bound on the shared GPU traces (figures measured from them) and on a real CPU run
(the framework-overhead mode); its split of the `other` idle with gpu-idle."""

from __future__ import annotations

import pytest
from conftest import by_rule, context, diagnosis, only
from cpu_trace import profile_loop

from trainprof.analysis.context import Context
from trainprof.analysis.dispatch import split_other
from trainprof.analysis.ledger import ledger
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
    assert m["idle_ms_per_step"] == pytest.approx(3.085, abs=0.002)
    assert f.est_saving_pct == pytest.approx(69.7, abs=0.1)
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
    assert f.metrics["ops_per_step"] == 20  # forward, loss, backward, zero_grad and SGD, top level
    assert f.metrics["median_op_us"] < 20 and f.metrics["us_per_op"] <= 100
    assert not by_rule(diagnosis(CPU_ONLY), "launch-bound")  # 346 ops in a 257 ms step
