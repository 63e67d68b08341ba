"""Assemble one MultiRankDiagnosis from the ranks' compact results."""

from __future__ import annotations

import numpy as np

from trainprof.analysis.engine import job_basis, on_basis
from trainprof.analysis.engine import rank as rank_findings
from trainprof.analysis.job import JobContext, rank_list
from trainprof.analysis.model import Finding, MultiRankDiagnosis
from trainprof.ranks import collectives as coll
from trainprof.ranks.fold import fold, merge_numbers, shape
from trainprof.ranks.load import RankResult
from trainprof.ranks.stats import step_table, summaries
from trainprof.rules import job_rules


def _wanted(rule: str, select: list[str] | None, ignore: list[str] | None) -> bool:
    return (not select or rule in select) and (not ignore or rule not in ignore)


def _notes(
    results: list[RankResult], world: int | None, ids: list[int], matched: int, dropped: list[int]
) -> list[str]:
    notes = []
    if world is not None and world > len(ids):
        missing = sorted(set(range(world)) - set(ids))
        listed = f" (missing: {rank_list(missing)})" if len(missing) <= 16 else ""
        notes.append(
            f"The job has {world} ranks; only {len(ids)} are present ({rank_list(ids)}){listed}: "
            "cross-rank figures cover these ranks only."
        )
    backends = {r.arrays.backend for r in results}
    if matched:
        fewest = min(len(r.arrays.comm_ts) for r in results)
        notes.append(
            f"{matched} collectives matched on every rank (of {fewest} communication kernels on "
            "the rank with the fewest; by their common end time): waiting and stragglers are "
            "measured on them."
        )
    elif backends == {"cpu"}:
        notes.append(
            "CPU (gloo) collectives: host ops do not show when each peer arrived, so waiting "
            "is not measured; a straggler is looked for in the per-rank breakdown instead."
        )
    elif backends - {"", "cpu"}:
        notes.append(
            "No collective could be matched across the ranks (clocks not aligned, or traces "
            "from different windows): waiting and stragglers are not measured."
        )
    if dropped:
        notes.append(
            f"comm-bound dropped on ranks {rank_list(dropped)}: their exposed communication is "
            "mostly waiting for other ranks."
        )
    notes.append(
        "Findings present on several ranks are folded into one row; its saving is the mean over "
        "those ranks."
    )
    return notes + rank_notes([(i if r.rank is None else r.rank, r.diagnosis.notes)
                               for i, r in enumerate(results)])


def rank_notes(per_rank: list[tuple[int, list[str]]]) -> list[str]:
    """The ranks' own notes, one per text that differs only in its numbers, each differing
    number shown as its range (a job of 256 ranks gets one note on the savings' basis, not
    256), prefixed with the ranks it holds for where that is not every rank."""
    groups: dict[str, tuple[list[int], list[str]]] = {}
    for rank, notes in per_rank:
        for n in notes:
            ranks, texts = groups.setdefault(shape(n), ([], []))
            if rank not in ranks:
                ranks.append(rank)
            if n not in texts:
                texts.append(n)
    everyone = len({rank for rank, _ in per_rank})
    out = []
    for ranks, texts in groups.values():
        text = merge_numbers(texts) or texts[0]
        if len(ranks) < everyone:
            which = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_list(sorted(ranks))}"
            text = f"On {which}: {text}"
        out.append(text)
    return out


def build_job(
    results: list[RankResult],
    path: str = "",
    select: list[str] | None = None,
    ignore: list[str] | None = None,
) -> MultiRankDiagnosis:
    """Cross-rank view of the ranks of one job (results sorted by rank)."""
    arrays = [r.arrays for r in results]
    means = np.array([r.diagnosis.steps.mean_ms for r in results])
    mean_iter_us = float(means.mean()) * 1000.0 if len(means) else 0.0
    m = coll.match(arrays)
    table = step_table(results)
    n_ranks = len(results)
    if len(m):
        in_win = m.step >= 0
        wait = m.wait
        wait_us = wait[in_win].sum(axis=0)
        last_n, caused = coll.last_arrivals(m.subset(in_win))
        strag = coll.stragglers(m, mean_iter_us)
        exposed_wait = coll.exposed_wait_us(m, arrays)
        starts = table.start[:, ~np.isnan(table.start).any(axis=0)]
        start_spread = float(np.ptp(starts, axis=0).max()) / 1000 if starts.size else None
    else:
        wait_us = None
        last_n, caused = np.zeros(n_ranks, np.int64), np.zeros(n_ranks)
        strag = coll.Stragglers(None, late_us=np.zeros(n_ranks))
        exposed_wait = None
        start_spread = None
    rows = summaries(
        results, wait_us, strag.late_us if strag.collective else None, last_n, caused
    )
    ids = [r.rank for r in rows]
    job = JobContext(
        ids=ids,
        diagnoses=[r.diagnosis for r in results],
        rows=rows,
        means_ms=means,
        mean_iter_us=mean_iter_us,
        stragglers=strag,
        exposed_wait_ms=[
            None if exposed_wait is None
            else float(exposed_wait[p]) / max(r.diagnosis.steps.count, 1) / 1000.0
            for p, r in enumerate(results)
        ],
        start_spread_ms=start_spread,
    )
    rules = [j for j in job_rules() if _wanted(j.id, select, ignore)]
    dropped: list[int] = []
    per_rank: list[tuple[int, list[Finding]]] = []
    for p, r in enumerate(results):
        kept = list(r.diagnosis.findings)
        for rule in rules:
            if rule.adjust is not None:
                kept = rule.adjust(job, p, kept)
        had = {f.rule for f in r.diagnosis.findings} - {f.rule for f in kept}
        if "comm-bound" in had:
            dropped.append(ids[p])
        per_rank.append((ids[p], kept))
    findings = fold(per_rank)
    for rule in rules:
        if rule.check is not None:
            findings.extend(rule.check(job))
    ratio = job.ratio
    job_step = job.job_step_ms
    # Folded and cross-rank findings on one step: with run metadata on every rank, the median
    # unprofiled step (their % are shares of it); else the profiled steps, as measured.
    basis = job_basis([r.diagnosis.saving_basis for r in results], job_step)
    on_basis(findings, basis)
    worlds = {r.world_size for r in results if r.world_size is not None}
    world = max(worlds) if worlds else None
    return MultiRankDiagnosis(
        path=path,
        world_size=world,
        ranks_present=ids,
        step_labels=table.labels,
        slowest_rank=table.slowest(ids),
        step_spread_ms=table.spread_ms(),
        imbalance=round(ratio, 3),
        collectives_matched=len(m),
        straggler_collective=strag.collective,
        ranks=rows,
        findings=rank_findings(findings),
        notes=_notes(results, world, ids, len(m), dropped),
        diagnoses=[r.diagnosis for r in results],
        saving_basis=basis,
    )
