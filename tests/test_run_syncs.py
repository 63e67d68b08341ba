"""Where sync findings point, on real `trainprof run`s of small CPU scripts (issue #10 item 8):
a training loop at module level, reads of CPU tensors by the DataLoader and a dataset, a read
both synced and logged, and a TorchMetrics update after `opt.step()`."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from test_run_cli import SCRIPTS, Run, line_of, run, trainprof

from trainprof.trace.frames import probe_library_frame, probe_location

TOPLEVEL = "train_toplevel.py"


def _diagnose(r: Run) -> list[dict]:
    done = trainprof("diagnose", str(r.folder), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["findings"]


def _at(marker: str) -> str:
    return f"{TOPLEVEL}:{line_of(TOPLEVEL, marker)}"


@pytest.fixture(scope="module")
def toplevel(tmp_path_factory) -> tuple[Run, list[dict]]:
    folder = tmp_path_factory.mktemp("toplevel") / "run"
    # 4 batches an epoch: a new DataLoader iterator (its seed `.item()`) inside the window.
    r = run(folder, "--wait", "3", "--warmup", "1", "--active", "4", str(SCRIPTS / TOPLEVEL))
    assert r.code == 0, r.stderr
    return r, _diagnose(r)


@pytest.mark.slow
def test_module_level_loop_findings_name_the_line_that_runs(toplevel) -> None:
    # Kineto keeps the module frame at the line where the window opened (`opt.step()`).
    _, findings = toplevel
    (metric,) = [f for f in findings if f["rule"] == "metric-sync"]
    assert metric["location"].endswith(_at("METRIC_LINE")), metric["location"]
    for bf16 in [f for f in findings if f["rule"] == "cpu-bf16"]:  # on CPUs with bf16 units
        assert bf16["location"].endswith(_at("FORWARD_LINE")), bf16["location"]
    stale = _at("STEP_LINE")
    assert not [f for f in findings if (f["location"] or "").endswith(stale)], findings


@pytest.mark.slow
def test_a_preempted_profiler_start_still_finds_the_stale_frame(toplevel, tmp_path: Path) -> None:
    # Kineto records the frames already running one after another; when the process is
    # preempted in that burst, a gap of any length opens between two of them. The same run's
    # trace with such a gap above the module frame: no finding may take its stale line.
    r, _ = toplevel
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(r.folder / "trainprof.json", folder)
    (trace,) = r.traces()
    with gzip.open(trace, "rt") as f:
        doc = json.load(f)
    py = [e for e in doc["traceEvents"] if e.get("cat") == "python_function"]
    at = f"{TOPLEVEL}({line_of(TOPLEVEL, 'STEP_LINE')}): <module>"
    (module,) = [e for e in py if e["name"].endswith(at)]
    for e in py:  # its callers, 1 ms earlier: the gap
        if e["tid"] == module["tid"] and e["args"]["Python id"] < module["args"]["Python id"]:
            e["ts"] -= 1000.0
            e["dur"] += 1000.0
    with gzip.open(folder / trace.name, "wt") as f:
        json.dump(doc, f)
    findings = _diagnose(Run(0, "", "", folder))
    (metric,) = [f for f in findings if f["rule"] == "metric-sync"]
    assert metric["location"].endswith(_at("METRIC_LINE")), metric["location"]
    stale = _at("STEP_LINE")
    assert not [f for f in findings if (f["location"] or "").endswith(stale)], findings


@pytest.mark.slow
def test_reads_of_cpu_tensors_by_the_data_pipeline_are_no_syncs(toplevel) -> None:
    r, findings = toplevel
    # The dataset's `target.item()` runs inside a DataLoader fetch: not even recorded.
    assert not [n for n in r.annotations() if n.startswith("trainprof/host_read") and
                n.endswith(f":{line_of(TOPLEVEL, 'DATASET_READ')}")]
    # The iterator's base seed `.item()` (torch/utils/data) is not reported either.
    syncs = [f for f in findings if f["rule"] in ("host-sync", "per-step-logging")]
    assert [f["location"] for f in syncs] == [syncs[0]["location"]], syncs
    assert syncs[0]["location"].endswith(_at("PRINT_LINE"))


@pytest.mark.slow
def test_a_logged_read_is_one_row(toplevel) -> None:
    _, findings = toplevel
    at_print = [f["rule"] for f in findings if (f["location"] or "").endswith(_at("PRINT_LINE"))]
    assert at_print == ["per-step-logging"], at_print


def test_probe_names_with_a_library_line() -> None:
    # A read a library makes on a device tensor (only on a GPU run): the user's line, then the
    # library's, which Kineto's frames do not have (they give the function's `def` line).
    name = (
        "trainprof/host_read:item@/home/me/train.py:31|/venv/lib/python3.11/site-packages/"
        "pytorch_lightning/trainer/connectors/logger_connector/result.py:482"
    )
    assert probe_location(name) == "/home/me/train.py:31"
    assert probe_library_frame(name) == (
        "pytorch_lightning/trainer/connectors/logger_connector/result.py(482): ?"
    )
    plain = "trainprof/host_read:item@/home/me/train.py:31"
    assert probe_location(plain) == "/home/me/train.py:31"
    assert probe_library_frame(plain) is None


@pytest.mark.slow
def test_a_script_edited_after_the_run_is_read_as_it_ran(tmp_path: Path) -> None:
    # The run keeps the script's text (capture/sources): the module frame's calls are aligned
    # with it, not with the file as it is after the user's edit.
    script = tmp_path / TOPLEVEL
    shutil.copy(SCRIPTS / TOPLEVEL, script)
    r = run(tmp_path / "run", "--wait", "3", "--warmup", "1", "--active", "4", str(script))
    assert r.code == 0, r.stderr
    kept = r.meta["sources"]
    assert str(script) in kept, kept
    assert (r.folder / kept[str(script)]).read_text() == script.read_text()
    metric_line = line_of(TOPLEVEL, "METRIC_LINE")
    script.write_text("# three lines added\n# after the run\n# by hand\n" + script.read_text())

    def metric_at(folder: Path) -> tuple[str, list[str]]:
        done = trainprof("diagnose", str(folder), "--json", "--no-cache")
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        (metric,) = [f for f in out["findings"] if f["rule"] == "metric-sync"]
        return metric["location"], out["notes"]

    location, notes = metric_at(r.folder)
    assert location.endswith(f"{TOPLEVEL}:{metric_line}"), location
    assert not [n for n in notes if "changed after this run started" in n], notes
    # The same run without the copy (older metadata) reads the edited file: its lines moved.
    meta = r.meta
    meta["sources"] = {}
    (r.folder / "trainprof.json").write_text(json.dumps(meta))
    location, notes = metric_at(r.folder)
    assert not location.endswith(f"{TOPLEVEL}:{metric_line}"), location
    assert [n for n in notes if "changed after this run started" in n], notes


@pytest.mark.slow
def test_the_run_keeps_the_files_of_the_loops_stack(tmp_path: Path) -> None:
    # A loop in a function of the user's own module, called from the script: the frames Kineto
    # finds running when the window opens are in both files; a library's are not kept.
    (tmp_path / "loop_mod.py").write_text(
        "import torch\n\n\ndef train(steps):\n"
        "    model = torch.nn.Linear(8, 1)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for _ in range(steps):\n"
        "        opt.zero_grad()\n"
        "        model(torch.randn(4, 8)).sum().backward()\n"
        "        opt.step()\n"
    )
    script = tmp_path / "main.py"
    script.write_text("from loop_mod import train\n\ntrain(12)\n")
    r = run(tmp_path / "run", "--wait", "2", "--warmup", "1", "--active", "2", str(script))
    assert r.code == 0, r.stderr
    kept = r.meta["sources"]
    assert set(kept) == {str(script), str(tmp_path / "loop_mod.py")}, kept
    assert all((r.folder / name).is_file() for name in kept.values())
