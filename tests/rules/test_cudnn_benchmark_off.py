"""cudnn-benchmark-off: inferred on a bare trace, read from the run metadata, never on CPU."""

from __future__ import annotations

import pytest
from conftest import by_rule, diagnosis, folder_diagnosis, only, trace_path

from trainprof.analysis.context import Context
from trainprof.analysis.precision import kernel_budget_us, savings
from trainprof.diagnose import diagnose_path
from trainprof.runmeta import Flags, RunMeta, read_meta, write_meta
from trainprof.trace.load import load_trace

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
RESNET_PARAM = "param/et_replay/tests/inputs/resnet_kineto.json.gz"
OWL = "TraceLens/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz"


def test_cudnn_benchmark_inferred_on_bare_resnet50_trace():
    f = only(diagnosis(NW0), "cudnn-benchmark-off")
    assert f.metrics["convs_per_step"] == 53  # ResNet-50's convolutions
    assert f.metrics["distinct_shapes"] == 23
    assert f.metrics["repeat_share"] == 1.0
    assert f.metrics["conv_kernel_ms_per_step"] == pytest.approx(66.67, abs=0.02)
    assert f.metrics["flag"] == "unknown (inferred)" and "inferred" in f.evidence
    assert f.est_saving_ms_per_step == 0 and f.severity == "low"
    assert "cudnn.benchmark = True" in f.fix


def _with_meta(tmp_path, rel, flags):
    (tmp_path / trace_path(rel).name).symlink_to(trace_path(rel))
    write_meta(RunMeta(flags=flags), tmp_path)
    (d,) = diagnose_path(tmp_path)
    return d


def test_cudnn_benchmark_flag_off_in_metadata(tmp_path):
    d = _with_meta(tmp_path, NW0, Flags(cudnn_benchmark=False))
    f = only(d, "cudnn-benchmark-off")
    assert f.metrics["flag"] == "False (metadata)"
    # 10 % of the conv kernel time, but only what faster kernels can still take off the step:
    # the host waited on a busy GPU 1.91 ms per step, all of it already claimed by no-amp.
    ctx = Context(load_trace(trace_path(NW0)), read_meta(tmp_path))
    left = kernel_budget_us(ctx) - sum(savings(ctx).values())
    want = 0.1 * f.metrics["conv_kernel_ms_per_step"]
    assert kernel_budget_us(ctx) == pytest.approx(1913.8, abs=0.5)
    assert f.est_saving_ms_per_step == pytest.approx(min(want, max(left, 0) / 1000), abs=0.002)
    assert f.est_saving_ms_per_step == 0 and "capped" in f.evidence
    assert f.severity == "low"


def test_cudnn_benchmark_flag_on_in_metadata(tmp_path):
    d = _with_meta(tmp_path, NW0, Flags(cudnn_benchmark=True))
    assert by_rule(d, "cudnn-benchmark-off") == []


@pytest.mark.parametrize("rel", [OWL, RESNET_PARAM])
def test_cudnn_benchmark_needs_repeated_recorded_shapes(rel):
    # owlv2: one step (no repetition to see); resnet_kineto: no Input Dims recorded.
    assert by_rule(diagnosis(rel), "cudnn-benchmark-off") == []


def test_cudnn_benchmark_never_on_cpu(cpu_bad):
    assert by_rule(folder_diagnosis(cpu_bad), "cudnn-benchmark-off") == []
