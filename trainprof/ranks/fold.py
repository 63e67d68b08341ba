"""Fold findings present on several ranks into one row.

Two findings are the same problem when they share the rule, the location and the title with every
number blanked out ("8x per step" and "6x per step" match). The folded finding carries `ranks`;
its title and evidence are the common text with every number that differs across ranks shown as
its range ("host blocked 0.12–6.67 ms/step"). When the evidences differ in more than numbers,
the evidence is the worst rank's, prefixed with its rank.

Saving: the MEAN over the ranks where the problem was found (est_saving_ms_per_step and
est_saving_pct), because in data-parallel training every rank runs the same step and a fix
applies to all of them; the range is kept in metrics (saving_ms_min / saving_ms_max). Severity
follows the mean saving (findings that claim no saving keep their own severity). `metrics` and
`at` are the worst rank's (the one with the largest saving), `metrics["at_rank"]` names it.
"""

from __future__ import annotations

from trainprof.analysis.job import NUMBER, rank_list, shape
from trainprof.analysis.model import Finding, severity_for, severity_rank

__all__ = ["fold", "merge_numbers", "rank_list", "shape"]


def merge_numbers(texts: list[str]) -> str | None:
    """One text with each differing number shown as 'min–max' (a range in a text counts with
    both its ends); None if the texts differ in more than numbers."""
    parts = [NUMBER.split(t) for t in texts]
    if any(p != parts[0] for p in parts[1:]):
        return None
    nums = [NUMBER.findall(t) for t in texts]
    out: list[str] = []
    for k, seg in enumerate(parts[0][:-1]):
        ends = [end for n in nums for end in n[k].split("–")]
        lo, hi = min(ends, key=float), max(ends, key=float)
        out.append(seg + (lo if float(lo) == float(hi) else f"{lo}–{hi}"))
    out.append(parts[0][-1])
    return "".join(out)


def _fold_group(items: list[tuple[int, Finding]]) -> Finding:
    ranks = sorted({r for r, _ in items})
    worst_rank, worst = max(items, key=lambda x: (x[1].est_saving_ms_per_step, -x[0]))
    if len(items) == 1:
        return Finding(**{**_fields(worst), "ranks": ranks})
    savings = [f.est_saving_ms_per_step for _, f in items]
    pcts = [f.est_saving_pct for _, f in items]
    mean_ms = sum(savings) / len(savings)
    mean_pct = sum(pcts) / len(pcts)
    title = merge_numbers([f.title for _, f in items]) or worst.title
    evidence = merge_numbers([f.evidence for _, f in items])
    if evidence is None:
        evidence = f"Rank {worst_rank} (largest saving): {worst.evidence}"
    if mean_ms > 0:
        severity = severity_for(mean_pct)
    else:
        severity = min((f.severity for _, f in items), key=severity_rank)
    metrics = {
        **worst.metrics,
        "at_rank": worst_rank,
        "ranks_found": len(ranks),
        "saving_ms_min": round(min(savings), 3),
        "saving_ms_max": round(max(savings), 3),
    }
    return Finding(
        **{
            **_fields(worst),
            "severity": severity,
            "title": title,
            "evidence": f"On ranks {rank_list(ranks)}: {evidence}",
            "est_saving_ms_per_step": round(mean_ms, 3),
            "est_saving_pct": round(mean_pct, 2),
            "metrics": metrics,
            "ranks": ranks,
        }
    )


def _fields(f: Finding) -> dict:
    return {k: getattr(f, k) for k in f.__struct_fields__}


def fold(per_rank: list[tuple[int, list[Finding]]]) -> list[Finding]:
    """One finding per (rule, location, title modulo numbers), with the ranks it was found on."""
    groups: dict[tuple, list[tuple[int, Finding]]] = {}
    for rank, findings in per_rank:
        for f in findings:
            groups.setdefault((f.rule, f.location, shape(f.title)), []).append((rank, f))
    return [_fold_group(items) for items in groups.values()]
