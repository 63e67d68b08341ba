"""Problems inside Lightning and the Hugging Face Trainer (issue #10 item 3), on real CPU runs:
the finding names the user's line and the library frames that do it (`via`), its fix is said in
the framework's terms, and a library's own sync is marked upstream. Every test runs a real
framework under `trainprof run` (marked slow): the Lightning and HF runs take 15-35 s here, the
accelerate one a few seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_run_cli import SCRIPTS, Run, line_of, run, trainprof

from trainprof.analysis.context import Context
from trainprof.analysis.frameworks import run_fix
from trainprof.trace.load import load_trace


def _findings(r: Run, *flags: str) -> str:
    done = trainprof("diagnose", str(r.folder), *flags)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _json(r: Run) -> list[dict]:
    return json.loads(_findings(r, "--json"))["findings"]


def _one(findings: list[dict], rule: str, fix_has: str) -> dict:
    hits = [f for f in findings if f["rule"] == rule and fix_has in f["fix"]]
    assert len(hits) == 1, [(f["rule"], f["fix"][:80]) for f in findings]
    return hits[0]


@pytest.fixture(scope="module")
def lightning(tmp_path_factory) -> Run:
    tmp = tmp_path_factory.mktemp("lightning")
    r = run(tmp / "run", str(SCRIPTS / "train_lightning.py"), str(tmp / "logs"), diagnose=True)
    assert r.code == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Run:
    tmp = tmp_path_factory.mktemp("hf")
    r = run(tmp / "run", str(SCRIPTS / "train_hf.py"), str(tmp / "out"))
    assert r.code == 0, r.stderr
    return r


@pytest.mark.slow
def test_lightning_log_read_names_fit_and_the_logger_connector(lightning: Run) -> None:
    fit = f"train_lightning.py:{line_of('train_lightning.py', 'FIT_LINE')}"
    f = _one(_json(lightning), "host-sync", "on_step=False, on_epoch=True")
    assert f["location"].endswith(fit), f["location"]
    assert f["via"][0].startswith("pytorch_lightning/trainer/trainer.py:"), f["via"]
    assert any(v.startswith("pytorch_lightning/trainer/connectors/logger_connector/")
               for v in f["via"]), f["via"]
    assert "Trainer(log_every_n_steps=" in f["fix"]
    # Every renderer shows the chain.
    console = lightning.stdout  # the finding's block: one `via` line per library frame
    vias = [ln.strip() for ln in console.splitlines() if ln.strip().startswith("via ")]
    assert any("pytorch_lightning/trainer/trainer.py:" in v for v in vias), console
    assert any("logger_connector/" in v for v in vias), console
    md = _findings(lightning, "--markdown")
    assert f"{fit}` → `pytorch_lightning/trainer/trainer.py:" in md
    html = (lightning.folder / "report.html").read_text()
    assert "→ <code>pytorch_lightning/trainer/trainer.py:" in html


@pytest.mark.slow
def test_lightning_fixes_in_lightning_terms(lightning: Run) -> None:
    f = _one(_json(lightning), "dataloader-starvation", "num_workers=")
    assert "train_dataloader()" in f["fix"], f["fix"]
    # GPU-only rules (no-amp, pageable-memcpy) cannot fire on CPU: their fixes, on this trace.
    (trace,) = Path(lightning.folder).glob("*.pt.trace.json.gz")
    ctx = Context(load_trace(str(trace)))
    assert run_fix(ctx, "amp_bf16", "generic").startswith('Trainer(precision="bf16-mixed")')
    assert "train_dataloader()" in run_fix(ctx, "pin_memory", "generic")


@pytest.mark.slow
def test_hf_trainer_nan_check_names_the_trainer_and_its_setting(hf: Run) -> None:
    train = f"train_hf.py:{line_of('train_hf.py', 'TRAIN_LINE')}"
    findings = _json(hf)
    f = _one(findings, "host-sync", "logging_nan_inf_filter=False")
    assert f["location"].endswith(train), f["location"]
    assert f["via"][0].startswith("transformers/trainer.py:"), f["via"]
    dl = _one(findings, "dataloader-starvation", "num_workers")
    assert dl["fix"].startswith("TrainingArguments(dataloader_num_workers="), dl["fix"]
    assert "dataloader_persistent_workers=True" in dl["fix"]


@pytest.mark.slow
def test_hf_library_sync_is_upstream(hf: Run) -> None:
    train = f"train_hf.py:{line_of('train_hf.py', 'TRAIN_LINE')}"
    f = _one(_json(hf), "host-sync", "upstream:")
    assert f["fix"].startswith("upstream: transformers.masking_utils._ignore_bidirectional_mask")
    assert "in transformers.masking_utils._ignore_bidirectional_mask_sdpa" in f["title"]
    assert f["location"].endswith(train)
    assert f["via"][-1].startswith("transformers/masking_utils.py:"), f["via"]


@pytest.mark.slow
def test_accelerate_fixes_in_accelerate_terms(tmp_path: Path) -> None:
    r = run(tmp_path / "run", "--wait", "2", "--warmup", "1", "--active", "3",
            str(SCRIPTS / "train_accelerate.py"))
    assert r.code == 0, r.stderr
    f = _one(_json(r), "dataloader-starvation", "num_workers=")
    assert f["location"].endswith(f"train_accelerate.py:{line_of('train_accelerate.py', 'LOADER')}")
    assert "accelerator.prepare()" in f["fix"], f["fix"]
    (trace,) = Path(r.folder).glob("*.pt.trace.json.gz")
    ctx = Context(load_trace(str(trace)))
    assert run_fix(ctx, "amp_bf16", "generic").startswith('Accelerator(mixed_precision="bf16")')
    assert "DataLoaderConfiguration(non_blocking=True)" in run_fix(ctx, "pin_memory", "generic")
