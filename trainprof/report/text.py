"""Plain-text pieces shared by the renderers."""

from __future__ import annotations

import os

from trainprof.analysis.model import BASIS_UNPROFILED, Diagnosis, Finding, MultiRankDiagnosis


def device_line(d: Diagnosis) -> str:
    dev = d.device
    if dev.kind == "cpu":
        return "CPU only (no GPU in this trace)"
    names = ", ".join(dev.names) if dev.names else dev.kind.upper()
    if dev.kind == "mtia":
        return f"{names} (non-CUDA accelerator)"
    if not dev.gpu_timeline:
        return f"{names} (no GPU activity recorded)"
    return names


def step_line(d: Diagnosis) -> str:
    s = d.steps
    line = f"{s.count} step{'s' if s.count != 1 else ''}, mean {s.mean_ms:.1f} ms, " \
        f"median {s.median_ms:.1f} ms"
    if d.gpu_busy_pct is not None:
        line += f", GPU busy {d.gpu_busy_pct:.1f} %"
    return line


def breakdown_line(d: Diagnosis) -> str:
    total = sum(d.breakdown.values()) or 1.0
    parts = [f"{k} {100 * v / total:.1f} %" for k, v in d.breakdown.items() if v > 0]
    return ", ".join(parts)


def where_text(f: Finding, sep: str = " → ") -> str:
    """The user's line, then the library frames that did it (`via`), or "-"."""
    if not f.location:
        return "-"
    return sep.join([f.location, *f.via])


def where_markdown(f: Finding) -> str:
    if not f.location:
        return "-"
    return " → ".join(f"`{x}`" for x in [f.location, *f.via])


def saving_text(f: Finding) -> str:
    if f.est_saving_ms_per_step <= 0:
        return "-"
    return f"{f.est_saving_ms_per_step:.2f} ms/step ({f.est_saving_pct:.1f} %)"


def basis_text(d: Diagnosis | MultiRankDiagnosis) -> str:
    """The step the est. savings are shares of, for column and summary headers."""
    b = d.saving_basis
    ranks = " over ranks" if isinstance(d, MultiRankDiagnosis) else ""
    if b.kind == BASIS_UNPROFILED:
        return f"unprofiled step, median{ranks} {b.step_ms:.1f} ms"
    if ranks:
        return f"profiled step, median over ranks of the mean {b.step_ms:.1f} ms"
    return f"profiled step, mean {b.step_ms:.1f} ms"


def saving_header(d: Diagnosis | MultiRankDiagnosis) -> str:
    return f"est. saving per step ({basis_text(d)})"


def title_of(d: Diagnosis) -> str:
    rank = f" (rank {d.rank})" if d.rank is not None else ""
    path = d.trace
    if os.path.isabs(path) and not (rel := os.path.relpath(path)).startswith(".."):
        path = rel
    return f"{path}{rank}"
