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


DLRM = Path("/work/shared/traces/param/et_replay/tests/inputs/dlrm_kineto")


@pytest.mark.skipif(not DLRM.is_dir(), reason="the shared DLRM traces are not here")
def test_a_multi_rank_run_loads_each_trace_once_and_writes_the_same_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ranks are diagnosed in worker processes, which also compute the per-step figures and
    write the XPlane files: the parent loads no trace again, and the reports are those the
    parent wrote when it loaded every trace again."""
    import shutil

    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import trainprof.trace.load as load
    from trainprof.diagnose import flat_diagnoses
    from trainprof.report.run_reports import diagnose_for_reports, write_run_reports

    traces = sorted(DLRM.glob("*.pt.trace.json.gz"))[:3]
    new, old = tmp_path / "new" / "run", tmp_path / "old" / "run"
    for folder in (new, old):
        folder.mkdir(parents=True)
        for f in traces:
            shutil.copyfile(f, folder / f.name)
    # The workers are forked: they call this too, and append to the same file.
    log = tmp_path / "loads.txt"
    real_load = load.load_trace

    def counting_load(path, *args, **kwargs):
        with open(log, "a") as out:
            out.write(f"{Path(path).parent.parent.name} {Path(path).name}\n")
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(load, "load_trace", counting_load)

    old_items, _ = diagnose_for_reports(old, old)
    log.write_text("")  # from here: what the old way (no worker results) loads again
    write_run_reports(old, flat_diagnoses(old_items), None)
    assert sorted(log.read_text().splitlines()) == sorted(f"old {f.name}" for f in traces)

    log.write_text("")
    items, kept = diagnose_for_reports(new, new)
    write_run_reports(new, flat_diagnoses(items), None, kept)
    # Each trace once in all: in its worker, for the diagnosis and the reports.
    assert sorted(log.read_text().splitlines()) == sorted(f"new {f.name}" for f in traces)

    # The same reports: report.html (but for the folder's path), the XPlane files, the
    # TensorBoard scalars of each rank.
    html_new = (new / "report.html").read_text().replace(str(new), "RUN")
    assert html_new == (old / "report.html").read_text().replace(str(old), "RUN")
    session = Path("plugins") / "profile" / "trainprof"
    planes = sorted(p.name for p in (new / session).glob("*.xplane.pb"))
    assert len(planes) == len(traces)
    assert planes == sorted(p.name for p in (old / session).glob("*.xplane.pb"))
    for name in planes:
        assert (new / session / name).read_bytes() == (old / session / name).read_bytes()
    ranks = sorted(p.name for p in new.glob("rank*") if p.is_dir())
    assert len(ranks) == len(traces)
    for rank in ranks:
        ea_new, ea_old = EventAccumulator(str(new / rank)), EventAccumulator(str(old / rank))
        ea_new.Reload()
        ea_old.Reload()
        tags = ea_new.Tags()["scalars"]
        assert tags and tags == ea_old.Tags()["scalars"]
        for tag in tags:
            a, b = ea_new.Scalars(tag), ea_old.Scalars(tag)
            assert [s.step for s in a] == [s.step for s in b]
            np.testing.assert_array_equal([s.value for s in a], [s.value for s in b])
