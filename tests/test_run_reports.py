"""What `trainprof run` writes into its run folder comes from the trace it loaded once: one
load_trace and one Context per trace serve the printed diagnosis and the reports (report.html,
TensorBoard's event files, the Trace Viewer's XPlane). A real run, in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainprof.analysis.context import Context
from trainprof.capture.runner import RunOptions, run_script

SCRIPTS = Path(__file__).parent / "scripts"


def test_run_loads_its_trace_once_for_the_diagnosis_and_the_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import trainprof.trace.load as load

    loaded: list[Path] = []
    real_load = load.load_trace

    def counting_load(path, *args, **kwargs):
        loaded.append(Path(path))
        return real_load(path, *args, **kwargs)

    made: list[Context] = []
    real_init = Context.__init__

    def counting_init(self, *args, **kwargs) -> None:
        made.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(load, "load_trace", counting_load)
    monkeypatch.setattr(Context, "__init__", counting_init)
    folder = tmp_path / "run"
    code = run_script(RunOptions(
        script=str(SCRIPTS / "train_basic.py"), script_args=["8"], out=folder,
        overrides={"wait": 1, "warmup": 1, "active": 2},
    ))
    assert code == 0
    assert "ranked by est. saving per step" in capsys.readouterr().out  # the diagnosis printed
    (trace,) = folder.glob("*.pt.trace.json.gz")
    assert loaded == [trace]
    assert len(made) == 1
    assert (folder / "report.html").is_file()
    assert any(folder.glob("events.out.tfevents.*"))
    assert any(folder.glob("plugins/profile/trainprof/*.xplane.pb"))
