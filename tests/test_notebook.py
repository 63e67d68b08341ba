"""The API in a real Jupyter kernel: nbclient executes a notebook that uses `%%trainprof` and
`trainprof.profile()`, on the venv's python (a kernelspec installed into a temporary prefix)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parent.parent

TRAIN = """\
import torch
from torch import nn

def train(steps, fail_at=None):
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
            raise ValueError("boom at step %d" % i)
"""


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A kernelspec for this python in a temporary prefix, found through JUPYTER_PATH."""
    prefix = tmp_path_factory.mktemp("jupyter")
    subprocess.run(
        [sys.executable, "-m", "ipykernel", "install", "--prefix", str(prefix),
         "--name", "trainprof-test"],
        check=True, capture_output=True,
    )
    env = dict(os.environ)
    env["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def execute(cells: list[nbformat.NotebookNode], cwd: Path, env: dict[str, str]):
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "trainprof-test", "display_name": "t",
                                 "language": "python"}
    old = dict(os.environ)
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        client = nbclient.NotebookClient(
            nb, kernel_name="trainprof-test", timeout=240, resources={"metadata": {"path": cwd}}
        )
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    return nb


def texts(cell: nbformat.NotebookNode, mime: str = "text/plain") -> str:
    out = []
    for o in cell.outputs:
        if o.output_type == "stream":
            out.append(o.text)
        elif "data" in o and mime in o.data:
            out.append(o.data[mime])
        elif o.output_type == "error":
            out.append("\n".join(o.traceback))
    return "\n".join(out)


@pytest.mark.slow
def test_cell_magic_and_context_manager_in_a_kernel(
    tmp_path: Path, kernel_env: dict[str, str]
) -> None:
    code, md = nbformat.v4.new_code_cell, nbformat.v4.new_markdown_cell
    failing = code("%%trainprof --wait 1 --warmup 1 --active 2 --out failed\ntrain(8, fail_at=5)")
    failing.metadata["tags"] = ["raises-exception"]
    cells = [
        code("%load_ext trainprof"),
        code(TRAIN),
        md("profile a cell"),
        code("%%trainprof --wait 1 --warmup 1 --active 2 --out cell\ntrain(8)"),
        code("print(_trainprof.folder.name, _trainprof.meta.status, "
             "sorted({f.rule for f in _trainprof.diagnosis.findings}))"),
        code("import trainprof\n"
             "with trainprof.profile('ctx', wait=1, warmup=1, active=2, show=False) as run:\n"
             "    train(8)\n"
             "print(run.folder.name, run.meta.window.recorded_steps, run.diagnosis.steps.count)"),
        code("run.diagnosis"),
        failing,
        code("print('after', _trainprof.meta.status, _trainprof.meta.exit_code, "
             "len(_trainprof.meta.traces))"),
    ]
    nb = execute(cells, tmp_path, kernel_env)
    c = nb.cells
    # %%trainprof: the diagnosis as HTML below the cell, the run folder written
    html = texts(c[3], "text/html")
    assert 'class="trainprof-nb"' in html and "Findings (" in html and "host-sync" in html
    meta = json.loads((tmp_path / "cell" / "trainprof.json").read_text())
    assert meta["status"] == "ok" and meta["window"]["recorded_steps"] == [2, 3]
    assert (tmp_path / "cell" / "report.html").is_file() and meta["traces"]
    assert "cell ok" in texts(c[4]) and "'host-sync'" in texts(c[4])
    # the context manager in a cell, after the magic: a second session in the same process
    assert "ctx [2, 3] 2" in texts(c[5])
    assert 'class="trainprof-nb"' in texts(c[6], "text/html")
    # nothing starts a kernel's cell again: `trainprof try` says so in one line
    assert json.loads((tmp_path / "ctx" / "trainprof.json").read_text())["argv"] == []
    tried = trainprof_cli("try", "ctx", cwd=tmp_path)
    assert tried.returncode == 2 and tried.stderr.count("\n") == 1, tried.stderr
    assert "has no command to start again" in tried.stderr
    # a cell that raises: IPython shows the traceback, the trace is saved and diagnosed
    assert "boom at step 5" in texts(c[7]) and any(o.output_type == "error" for o in c[7].outputs)
    assert 'class="trainprof-nb"' in texts(c[7], "text/html")
    assert "after error 1 1" in texts(c[8])
    failed = json.loads((tmp_path / "failed" / "trainprof.json").read_text())
    assert failed["status"] == "error" and failed["traces"]


def trainprof_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "trainprof", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


def trainprof_run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return trainprof_cli("run", *args, cwd=cwd)


@pytest.mark.slow
def test_run_a_notebook_cell_by_cell(tmp_path: Path) -> None:
    code = nbformat.v4.new_code_cell
    nb = nbformat.v4.new_notebook(cells=[
        code("%matplotlib inline\n" + TRAIN + "!nvidia-smi"),
        code("%%time\nraise SystemExit('a cell magic cell must not run')"),
        nbformat.v4.new_markdown_cell("# training"),
        code("train(8, fail_at=6)"),
    ])
    nbformat.write(nb, tmp_path / "nb.ipynb")
    r = trainprof_run("--wait", "1", "--warmup", "1", "--active", "2", "--out", "r", "nb.ipynb",
                      cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "note: notebook cell 1 line 1 left out (IPython): %matplotlib inline" in r.stderr
    assert "note: notebook cell 2 skipped (%%time: a cell magic needs IPython)" in r.stderr
    cell3 = f"{tmp_path.resolve() / 'nb.ipynb'}#cell3"
    assert f'File "{cell3}", line 1, in <module>\n    train(8, fail_at=6)' in r.stderr
    assert "ValueError: boom at step 6" in r.stderr
    meta = json.loads((tmp_path / "r" / "trainprof.json").read_text())
    assert meta["status"] == "error" and meta["window"]["recorded_steps"] == [2, 3]
    item = 1 + TRAIN.splitlines().index(
        next(t for t in TRAIN.splitlines() if t.endswith("# ITEM_LINE"))
    ) + 1  # the cell's first line is the left-out magic
    import trainprof  # the .item() finding points at the line in the cell

    sync = [f for f in trainprof.diagnose(tmp_path / "r").findings if f.rule == "host-sync"]
    assert sync and (sync[0].location or "").endswith(f"nb.ipynb#cell1:{item}")


@pytest.mark.slow
def test_try_runs_a_recorded_notebook_again(tmp_path: Path) -> None:
    """`trainprof try` on a notebook's run: its cells run again in the rounds, with the fix."""
    code = nbformat.v4.new_code_cell
    nb = nbformat.v4.new_notebook(cells=[code("%matplotlib inline\n" + TRAIN), code("train(60)")])
    nbformat.write(nb, tmp_path / "nb.ipynb")
    r = trainprof_run("--wait", "1", "--warmup", "1", "--active", "2", "--out", "r", "nb.ipynb",
                      cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    tried = trainprof_cli("try", "r", "--fix", "optimizer-foreach", "--rounds", "1", "--steps",
                          "40", cwd=tmp_path)
    assert tried.returncode == 0, tried.stderr
    (fix,) = json.loads((tmp_path / "r" / "try.json").read_text())["fixes"]
    assert fix["measured_pct"] is not None and fix["verdict"] != "error", fix
    assert "fused=True" in fix["change"] or "foreach=True" in fix["change"]


def test_unreadable_notebook_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.ipynb").write_text("{not json")
    r = trainprof_run("bad.ipynb", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "bad.ipynb is not a Jupyter notebook" in r.stderr and not (tmp_path / "runs").exists()


def test_a_notebook_without_cell_ids_reads_without_warnings(tmp_path: Path) -> None:
    """Cells without ids (notebooks written before nbformat 4.5): nbformat warns once per
    read, which says nothing of the cells' code; `run` reads the notebook twice."""
    import warnings

    from trainprof.capture.notebook import read_cells

    doc = {"cells": [{"cell_type": "code", "metadata": {}, "source": "x = 1", "outputs": [],
                      "execution_count": None}],
           "metadata": {}, "nbformat": 4, "nbformat_minor": 5}  # fmt: skip
    (tmp_path / "old.ipynb").write_text(json.dumps(doc))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cells, notes = read_cells(tmp_path / "old.ipynb")
    assert len(cells) == 1 and not notes
    assert not [w for w in seen if "missing an id" in str(w.message)]
