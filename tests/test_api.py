"""The Python API: trainprof.profile() around real training code (twice in one process, with
an exception, with max_steps), trainprof.diagnose() / compare() and the objects they return,
`python -m trainprof`, a cheap `import trainprof`, and the HTML repr in headless Chromium."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from browser import dump_dom, require_chromium
from torch import nn
from typer.testing import CliRunner

import trainprof
from trainprof.analysis.model import Diagnosis
from trainprof.cli import app
from trainprof.errors import TrainprofError

ROOT = Path(__file__).resolve().parent.parent
SMALL = {"wait": 1, "warmup": 1, "active": 2}


def train(steps: int, fail_at: int | None = None) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(16, 32)).pow(2).mean()
        loss.backward()
        opt.step()
        loss.item()  # ITEM_LINE
        if i == fail_at:
            raise ValueError(f"boom at step {i}")


ITEM_LINE = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1)
                 if t.endswith("# ITEM_LINE"))


def trace_counts(folder: Path) -> Counter:
    (trace,) = folder.glob("*.pt.trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    return Counter(
        e["name"] if e.get("cat") == "user_annotation" else e.get("cat") for e in events
    )


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[trainprof.Profile]:
    """Two profiled blocks in this one process, one after the other."""
    tmp = tmp_path_factory.mktemp("api")
    runs = []
    for k in range(2):
        with trainprof.profile(tmp / f"run{k}", show=False, **SMALL) as run:
            train(8)
        runs.append(run)
    return runs


@pytest.mark.slow
def test_profile_writes_a_run_folder_and_holds_the_diagnosis(two_runs) -> None:
    run = two_runs[0]
    assert run.folder is not None and (run.folder / "report.html").is_file()
    meta = json.loads((run.folder / "trainprof.json").read_text())
    assert meta["status"] == "ok" and meta["exit_code"] == 0
    assert meta["step_source"] == "optimizer" and len(meta["step_times_s"]) == 8
    assert meta["window"]["recorded_steps"] == [2, 3] and meta["traces"]
    assert isinstance(run.diagnosis, Diagnosis) and run.diagnosis.steps.count == 2
    sync = [f for f in run.diagnosis.findings if f.rule == "host-sync"]
    assert sync and (sync[0].location or "").endswith(f"test_api.py:{ITEM_LINE}")


@pytest.mark.slow
def test_second_session_in_one_process_records_the_same(two_runs) -> None:
    """torch 2.14 on the CPU: the second profiler session records every op and probe the first
    did (GPU events after the first session, pytorch #175790, are not verified here)."""
    first, second = (trace_counts(r.folder) for r in two_runs)
    assert second["cpu_op"] == first["cpu_op"] > 0
    for probe in ("trainprof/forward", "trainprof/backward", "ProfilerStep#2", "ProfilerStep#3"):
        assert second[probe] == first[probe] > 0, probe
    assert two_runs[1].diagnosis is not None and two_runs[1].diagnosis.steps.count == 2


def test_exception_propagates_and_the_trace_is_saved(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="boom at step 5"):
        with trainprof.profile(tmp_path / "r", show=False, **SMALL) as run:
            train(8, fail_at=5)
    assert run.meta is not None and run.meta.status == "error" and run.meta.exit_code == 1
    meta = json.loads((tmp_path / "r" / "trainprof.json").read_text())
    assert meta["status"] == "error" and meta["window"]["recorded_steps"] == [2, 3]
    assert run.diagnosis is not None and (tmp_path / "r" / "report.html").is_file()
    assert "boom at step 5" in (tmp_path / "r" / "trainprof.log").read_text()


def test_max_steps_ends_the_block_quietly(tmp_path: Path) -> None:
    with trainprof.profile(tmp_path / "r", show=False, max_steps=9, **SMALL) as run:
        train(1000)
    assert run.meta is not None and run.meta.status == "ok"
    assert len(run.meta.step_times_s) == 9


@pytest.mark.slow
def test_profile_refuses_a_folder_in_use(two_runs) -> None:
    with pytest.raises(TrainprofError):
        with trainprof.profile(two_runs[0].folder, **SMALL):
            pytest.fail("the block must not run")


def test_nested_profile_is_refused_and_the_outer_one_completes(tmp_path: Path) -> None:
    with trainprof.profile(tmp_path / "outer", show=False, **SMALL) as outer:
        train(3)
        with pytest.raises(TrainprofError, match="already being profiled"):
            with trainprof.profile(tmp_path / "inner", **SMALL):
                pytest.fail("the inner block must not run")
        train(3)
    assert not (tmp_path / "inner").exists()
    assert outer.meta is not None and outer.meta.status == "ok"
    assert len(outer.meta.step_times_s) == 6 and outer.meta.window.recorded_steps == [2, 3]


@pytest.mark.slow
def test_diagnose_returns_what_the_cli_prints(two_runs) -> None:
    folder = two_runs[0].folder
    d = trainprof.diagnose(folder)
    printed = CliRunner().invoke(app, ["diagnose", "--json", str(folder)]).stdout
    assert json.loads(d.to_json()) == json.loads(printed)
    f = d.findings[0]
    assert {f.rule, f.severity, f.title, f.evidence, f.fix} and f.saving == f.est_saving_ms_per_step
    assert [x.rule for x in trainprof.diagnose(folder, select=["host-sync"]).findings] == [
        "host-sync"
    ]
    with pytest.raises(TrainprofError, match="no such file"):
        trainprof.diagnose(folder / "missing")


@pytest.mark.slow
def test_compare_returns_what_the_cli_prints(two_runs) -> None:
    a, b = (r.folder for r in two_runs)
    comp = trainprof.compare(a, b, fail_if_slower=1000)
    printed = CliRunner().invoke(app, ["compare", "--json", str(a), str(b)]).stdout
    expected = json.loads(printed)
    got = json.loads(comp.to_json())
    assert got["gate"]["failed"] is False and expected["gate"] is None
    got["gate"] = None
    assert got == expected
    html = comp._repr_html_()
    assert 'class="trainprof-nb"' in html and comp.change.verdict in html


@pytest.mark.slow
def test_html_repr_shows_the_findings_offline(two_runs, tmp_path: Path) -> None:
    d = two_runs[0].diagnosis
    html = d._repr_html_()
    for bad in ("<script", "src=", "url(", "@import"):
        assert bad not in html  # nothing fetched, nothing run
    # Links stay inside the fragment: each finding's rule to its description below it.
    targets = re.findall(r'href="([^"]*)"', html)
    assert targets and all(t.startswith("#") for t in targets), targets
    assert all(f'id="{t[1:]}"' in html for t in targets), targets
    chromium_page = tmp_path / "repr.html"
    chromium_page.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'><style>h2 { color: red }</style>"
        f"</head><body><div id='outside'><h2>notebook heading</h2></div>{html}</body></html>"
    )
    require_chromium()
    dom = dump_dom(chromium_page.as_uri())
    assert f"Findings ({len(d.findings)})" in dom
    for f in d.findings:
        assert f.title.split("(")[0].strip()[:40] in dom.replace("&amp;", "&")
    assert "notebook heading" in dom


def test_import_is_cheap_and_names_resolve() -> None:
    code = (
        "import sys, trainprof\n"
        "assert callable(trainprof.profile) and callable(trainprof.diagnose)\n"
        "assert 'torch' not in sys.modules, 'import trainprof imported torch'\n"
        "import trainprof.diagnose, trainprof.compare\n"
        "from trainprof.diagnose import diagnose_items\n"
        "assert trainprof.diagnose.__module__ == 'trainprof.api'\n"
        "assert trainprof.compare.__module__ == 'trainprof.api'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_python_m_trainprof_is_the_cli(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "trainprof", "diagnose", str(tmp_path / "nothing")],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"trainprof: error: no such file or folder: "
                                             f"{tmp_path / 'nothing'}"]


def test_the_process_command_is_recorded_for_try(tmp_path: Path) -> None:
    """What `trainprof try` starts again (RunMeta.argv): a script with its arguments, a module
    run with -m (a package by its name), nothing for python -c."""
    show = "import json, trainprof.api; print(json.dumps(trainprof.api.process_command()))\n"
    (tmp_path / "train.py").write_text(show)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "__main__.py").write_text(show)
    (tmp_path / "pkg" / "fit.py").write_text(show)
    for cmd, want in ((["train.py", "--lr", "1"], [str(tmp_path / "train.py"), "--lr", "1"]),
                      (["-m", "pkg", "a"], ["-m", "pkg", "a"]),
                      (["-m", "pkg.fit", "b"], ["-m", "pkg.fit", "b"]),
                      (["-c", show, "x"], [])):
        r = subprocess.run([sys.executable, *cmd], cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == want, cmd
