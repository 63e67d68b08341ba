"""ranks.lockstep_metas: a job's ranks wait for each other at every step, so the steps in which
one rank ran trainprof's probes (thread steps, a worker's timed fetches) are left out of every
rank's statistics, not only of its own."""

from __future__ import annotations

from pathlib import Path

import pytest
from cpu_trace import record

from trainprof.analysis.model import MultiRankDiagnosis
from trainprof.diagnose import diagnose_items
from trainprof.ranks import lockstep_metas
from trainprof.runmeta import RunMeta, Window, write_meta


def _rank(rank: int, world: int = 2, **kw) -> RunMeta:
    return RunMeta(rank=rank, world_size=world, step_times_s=[0.01] * 30, **kw)


def test_a_ranks_probes_are_left_out_of_its_peers_steps(tmp_path: Path):
    job = tmp_path / "run"
    files = [job / "rank0.1.pt.trace.json.gz", job / "rank1.1.pt.trace.json.gz"]
    paused = list(range(5, 22))  # rank 1's worker timed its fetches; rank 0 ran no probe
    threads = [[s, 2 if s % 2 == 0 else 1] for s in range(18, 26)]  # 19, 21 in rank 1's
    metas = [_rank(0, thread_steps=threads), _rank(1, worker_fetch_steps=paused)]
    zero, one = lockstep_metas(files, metas)
    assert zero is not None and one is not None
    # Each gets the other's steps that are not already its own.
    assert zero.peer_probe_steps == sorted(set(paused) - {19, 21})
    assert one.peer_probe_steps == [23, 25]
    assert zero.altered_steps() == one.altered_steps() == set(paused) | {23, 25}
    assert metas[0].peer_probe_steps == []  # the metadata given is not changed


def test_no_peers_outside_a_job(tmp_path: Path):
    one = RunMeta(worker_fetch_steps=[5, 6])
    other = [_rank(0), _rank(1, worker_fetch_steps=[5, 6])]
    # One process; two ranks in two folders (two jobs of one rank each here); no metadata.
    files = [tmp_path / "a" / "t.pt.trace.json", tmp_path / "b" / "rank0.pt.trace.json",
             tmp_path / "c" / "rank1.pt.trace.json", tmp_path / "d" / "t.pt.trace.json"]
    out = lockstep_metas(files, [one, *other, None])
    assert out[0] is one and out[1] is other[0] and out[2] is other[1] and out[3] is None


LOOP = """
import torch

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def step(i):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
"""


@pytest.mark.slow
def test_the_jobs_saving_basis_leaves_out_a_peers_pauses(tmp_path: Path):
    """End to end through `trainprof diagnose` of a job folder: rank 1 paused for a worker's
    timed fetches in steps 5-21 (left out of its own statistics); rank 0 waited through them,
    its steps 10 ms there against 4 ms elsewhere, most of its 30. The job's basis is the 4 ms
    step (the median of the ranks' would be 7 ms with rank 0's own 10)."""
    trace = record(tmp_path / "rec", LOOP, steps=3) / "cpu.1.pt.trace.json"
    job = tmp_path / "job"
    job.mkdir()
    paused = list(range(5, 22))
    for rank in (0, 1):
        (job / f"rank{rank}.1.pt.trace.json").symlink_to(trace)
        times = [0.004] * 30
        if rank == 0:
            for s in paused:
                times[s] = 0.010
        meta = RunMeta(rank=rank, world_size=2, step_times_s=times, fetch_times_s=[0.0] * 30,
                       window=Window(wait=1, warmup=1, active=3, recorded_steps=[2, 3, 4]),
                       worker_fetch_steps=paused if rank == 1 else [])
        write_meta(meta, job, f"trainprof.rank{rank}.json")
    (item,) = diagnose_items(job)
    assert isinstance(item, MultiRankDiagnosis)
    assert item.saving_basis.kind == "unprofiled"
    assert item.saving_basis.step_ms == pytest.approx(4.0)
