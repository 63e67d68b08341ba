"""fp16-dims on the shared GPU traces (owlv2's attention, BERT's vocabulary) and on a real CPU
run of a bf16 layer with 1001 outputs."""

from __future__ import annotations

import pytest
from conftest import by_rule, diagnosis, only
from cpu_trace import profile_loop

from trainprof.engine import analyze
from trainprof.trace.load import load_trace

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
CONTROL = "HolisticTraceAnalysis/trace_diff/control/control.json.gz"
CPU_ONLY = "HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
BERT = "TraceLens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
OWL = "TraceLens/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz"
B200 = "TraceLens/b200/eager_trace.json.gz"
# The rules of issue 4 part A, none of which but fp16-dims and launch-bound may fire on the
# CPU run below.
PART_A = {"no-amp", "tf32-off", "launch-bound", "gpu-idle", "fp16-dims", "batch-size",
          "memory-pressure"}


def test_fp16_dims_owlv2_attention_bmm_over_5185_tokens():
    f = only(diagnosis(OWL), "fp16-dims")
    m = f.metrics
    assert m["misaligned_per_step"] == 240
    assert m["shapes"] == "aten::bmm 16x[5185x64] @ [64x5185]; aten::bmm 16x[5185x5185] @ [5185x64]"
    assert m["misaligned_kernel_ms_per_step"] == pytest.approx(229.327, abs=0.01)
    assert m["aligned_tflops"] == pytest.approx(562.0, abs=0.5)
    # 58 against 562 TFLOP/s: the 2x ceiling binds, half of the kernel time.
    assert f.est_saving_ms_per_step == pytest.approx(229.327 / 2, abs=0.01)
    assert f.severity == "medium"
    assert "scaled_dot_product_attention" in f.fix
    assert diagnosis(OWL).findings[0].rule == "dataloader-starvation"


def test_fp16_dims_bert_vocab_reported_without_a_saving():
    f = only(diagnosis(BERT), "fp16-dims")
    assert "[141x512] @ [512x30522] (N=30522)" in f.evidence
    assert (f.severity, f.est_saving_ms_per_step) == ("low", 0.0)  # it ran no slower here
    assert "multiple of 64" in f.fix


@pytest.mark.parametrize("rel", [B200, NW0, CONTROL, CPU_ONLY])
def test_fp16_dims_silent_on_aligned_or_fp32(rel):
    assert not by_rule(diagnosis(rel), "fp16-dims")


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    nn = torch.nn
    bf = torch.bfloat16
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1001)).to(bf)
    path = tmp_path_factory.mktemp("cpu_runs") / "odd.json"
    x, y = torch.randn(2, 64, dtype=bf), torch.randn(2, 1001, dtype=bf)
    return analyze(load_trace(profile_loop(path, model, x, y, steps=4)))


def test_cpu_run_bf16_linear_with_1001_outputs(odd):
    f = only(odd, "fp16-dims")
    assert (f.severity, f.est_saving_ms_per_step) == ("low", 0.0)
    assert "aten::addmm [2x64] @ [64x1001] (N=1001)" in f.evidence
    assert "No GPU here" in f.evidence
    assert {x.rule for x in odd.findings} & (PART_A - {"fp16-dims", "launch-bound"}) == set()
