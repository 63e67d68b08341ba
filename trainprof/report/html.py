"""The HTML report: one self-contained file (inline CSS and SVG, no script, nothing fetched) with
the step time of every step (traced, evaluation and outlier steps marked), the per-step
breakdown, the ranked findings with evidence and fixes (each linked to a description of its rule
inside the report), the run metadata and, for several ranks, the step time of each rank. Every
piece of text is escaped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import PurePath

from trainprof.analysis.breakdown import CPU_CATEGORIES, GPU_CATEGORIES
from trainprof.analysis.model import Diagnosis, Finding
from trainprof.report import svg
from trainprof.report.per_step import PerStep
from trainprof.report.step_marks import OUTLIER_X, step_marks
from trainprof.report.text import device_line, saving_header, saving_text, step_line, title_of
from trainprof.rules import Rule, all_rules
from trainprof.runmeta import RunMeta

COLORS = {
    "Kernel": "#4c9a5a",
    "Memcpy": "#4c78a8",
    "Memset": "#9ecae9",
    "Communication": "#9467bd",
    "Runtime": "#f58518",
    "DataLoader": "#d6404e",
    "CPU Exec": "#c9a227",
    "Metrics": "#e377c2",
    "Optimizer": "#17becf",
    "Backward": "#4c78a8",
    "Forward": "#4c9a5a",
    "Other": "#b0b5bd",
}
RULE_DOCS = "docs/rules"  # the rule pages, relative to the trainprof repository's root
EVAL_COLOR = "#9467bd"  # a step holding an evaluation pass
OUTLIER_COLOR = "#c62828"  # a step far slower than the median
SEV_COLORS = {"high": "#c62828", "medium": "#e08a00", "low": "#2f7bbf", "info": "#7a828e"}

CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #f4f5f7; color: #1d2127;
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
main { max-width: 1100px; margin: 0 auto; padding: 24px 20px 48px; }
header h1 { font-size: 24px; margin: 0 0 4px; }
.sub { color: #5b6270; margin: 0 0 16px; word-break: break-all; }
section { background: #fff; border: 1px solid #dfe2e6; border-radius: 8px; padding: 16px 20px;
  margin: 16px 0; }
h2 { font-size: 18px; margin: 0 0 10px; }
h3 { font-size: 15px; margin: 14px 0 6px; }
.tiles { display: flex; flex-wrap: wrap; gap: 12px; margin: 0 0 8px; }
.tile { background: #fff; border: 1px solid #dfe2e6; border-radius: 8px; padding: 10px 16px;
  min-width: 150px; }
.tile .v { font-size: 22px; font-weight: 600; }
.tile .k { color: #5b6270; font-size: 13px; }
.chart { width: 100%; height: auto; display: block; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 16px; font-size: 13px; margin: 6px 0 0; }
.legend i { display: inline-block; width: 12px; height: 12px; border-radius: 2px;
  margin-right: 5px; vertical-align: -1px; }
.finding { border: 1px solid #dfe2e6; border-left: 6px solid #7a828e; border-radius: 6px;
  padding: 10px 14px; margin: 10px 0; }
.finding h3 { margin: 0 0 4px; font-size: 16px; }
.finding .meta { color: #5b6270; font-size: 13px; margin: 0 0 6px; }
.sev { display: inline-block; color: #fff; border-radius: 4px; padding: 0 7px; font-size: 12px;
  font-weight: 600; text-transform: uppercase; margin-right: 6px; vertical-align: 2px; }
pre { background: #f4f5f7; border-radius: 4px; padding: 8px 10px; margin: 6px 0 0;
  white-space: pre-wrap; word-break: break-word; font-size: 13px; }
code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 13px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; margin: 4px 0 8px; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #eceef1;
  vertical-align: top; }
th { color: #5b6270; font-weight: 600; }
.notes { color: #5b6270; font-size: 13px; padding-left: 18px; margin: 6px 0 0; }
details > summary { cursor: pointer; font-weight: 600; font-size: 16px; }
footer { color: #8a909a; font-size: 12px; text-align: center; }
"""


@dataclass
class ReportItem:
    """One trace of the report: its diagnosis, its per-step figures and its run metadata."""

    diagnosis: Diagnosis
    per_step: PerStep | None = None
    meta: RunMeta | None = None


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def _ms(v: float) -> str:
    return f"{v:.1f} ms" if v >= 10 else f"{v:.2f} ms"


def _tile(value: str, key: str) -> str:
    return f'<div class="tile"><div class="v">{_e(value)}</div><div class="k">{_e(key)}</div></div>'


def _legend(names: Iterable[str], values: dict[str, float] | None = None) -> str:
    total = sum(values.values()) if values else 0.0
    items = []
    for n in names:
        extra = ""
        if values and total > 0:
            extra = f" {_ms(values.get(n, 0.0))} ({100 * values.get(n, 0.0) / total:.1f} %)"
        items.append(f'<span><i style="background:{COLORS.get(n, "#999")}"></i>{_e(n)}{_e(extra)}'
                     "</span>")
    return f'<div class="legend">{"".join(items)}</div>'


def _categories(d: Diagnosis) -> list[str]:
    order = GPU_CATEGORIES if d.device.gpu_timeline else CPU_CATEGORIES
    return [c for c in order if c in d.breakdown] + [c for c in d.breakdown if c not in order]


def _shown(d: Diagnosis, cats: Sequence[str]) -> list[str]:
    """Categories with any time (a legend of zeros is noise)."""
    return [c for c in cats if d.breakdown.get(c, 0.0) > 0]


def breakdown_chart(item: ReportItem) -> str:
    d, ps = item.diagnosis, item.per_step
    cats = _shown(d, _categories(d))
    if not cats:
        return ""
    if ps is not None and len(ps.labels):
        labels = [f"#{n}" for n in ps.numbers]
        series = {c: ps.categories[c].tolist() for c in cats if c in ps.categories}
    else:  # no per-step figures: one bar of the means
        labels = ["mean"]
        series = {c: [d.breakdown[c]] for c in cats}
    chart = svg.stacked_bars(labels, series, COLORS, label="time per step by category")
    return (
        "<h3>Where each traced step's time goes</h3>" + chart
        + _legend(cats, {c: d.breakdown[c] for c in cats})
    )


def _step_list(steps: Sequence[int], most: int = 8) -> str:
    shown = ", ".join(f"#{i}" for i in steps[:most])
    return shown + (f" and {len(steps) - most} more" if len(steps) > most else "")


def step_time_chart(meta: RunMeta) -> str:
    """Wall time of every step of the run: the traced ones, those holding an evaluation pass
    and the outliers marked, named in the legend and a note under the chart."""
    m = step_marks(meta)
    times = m.times_ms
    if not times:
        return ""
    n = len(times)
    colors = [EVAL_COLOR if i in m.evals or i in m.threads or i in m.worker_timing
              else OUTLIER_COLOR if i in m.outliers else None for i in range(n)]
    marks = ["eval" if i in m.evals else f"{m.threads[i]}t" if i in m.threads
             else "w" if i in m.worker_timing
             else f"{m.outliers[i]:.0f}×" if i in m.outliers else "" for i in range(n)]
    plain = [t for i, t in enumerate(times) if colors[i] is None]
    # An outlier 20x the median would flatten every other bar: the axis ends above the others.
    cap = 1.25 * max(plain) if plain and max(times) > 1.25 * max(plain) else None
    chart = svg.bars(
        [f"#{i}" for i in range(n)],
        times,
        highlight=[i in m.traced for i in range(n)],
        label="wall time of every step",
        colors=colors,
        marks=marks,
        cap=cap,
    )
    legend = ['<span><i style="background:#4c78a8"></i>step wall time</span>',
              '<span><i style="background:#f58518"></i>traced step</span>']
    notes = []
    if m.evals:
        kinds = ", ".join(meta.eval_kinds) or "evaluation"
        evals = sorted(m.evals)
        legend.append(f'<span><i style="background:{EVAL_COLOR}"></i>evaluation pass: '
                      f"{_e(_step_list(evals))}</span>")
        notes.append(f"Step{'s' if len(evals) > 1 else ''} {_step_list(evals)} "
                     f"{'hold' if len(evals) > 1 else 'holds'} an evaluation pass ({kinds}): "
                     "left out of the step statistics and findings.")
    if m.threads:
        steps = sorted(m.threads)
        counts = ", ".join(str(c) for c in sorted(set(m.threads.values())))
        legend.append(f'<span><i style="background:{EVAL_COLOR}"></i>fewer threads: '
                      f"{_e(_step_list(steps))}</span>")
        notes.append(f"Steps {_step_list(steps)} ran with {counts} intra-op thread(s) instead of "
                     f"{meta.torch_threads}, every other step after the profiled window, to time "
                     "the model as a DataLoader fix with workers would leave it: left out of the "
                     "step statistics.")
    if m.worker_timing:
        steps = sorted(m.worker_timing)
        legend.append(f'<span><i style="background:{EVAL_COLOR}"></i>worker timing (w): '
                      f"{_e(_step_list(steps))}</span>")
        notes.append(f"Step{'s' if len(steps) > 1 else ''} {_step_list(steps)} ran while a "
                     "DataLoader worker forked from the loop fetched one of the script's batches "
                     "at step boundaries, the loop waiting (what a worker spends per batch, for "
                     "the DataLoader fix), or just after it stopped; the loop's steps are slower "
                     "then: left out of the step statistics.")
    if m.outliers:
        out = sorted(m.outliers)
        legend.append(f'<span><i style="background:{OUTLIER_COLOR}"></i>outlier '
                      f"(≥ {OUTLIER_X:g}× the median): {_e(_step_list(out))}</span>")
        worst = ", ".join(f"#{i} {_ms(times[i])} ({m.outliers[i]:.0f}×)" for i in out[:8])
        notes.append(f"Outlier step{'s' if len(out) > 1 else ''}, at least {OUTLIER_X:g}× the "
                     f"median training step ({_ms(m.median_ms)}): {worst}"
                     f"{' …' if len(out) > 8 else ''}. A first step that compiles or warms up, "
                     "a checkpoint, an evaluation the probes did not see, or a machine busy with "
                     "other work; savings are shares of the median step, which they do not move.")
    if cap is not None:
        notes.append(f"The axis ends at {_ms(cap)}: taller bars are cut (hover for their time).")
    note = ('<ul class="notes">' + "".join(f"<li>{_e(x)}</li>" for x in notes) + "</ul>"
            if notes else "")
    return (f"<h3>Step wall time, all {n} steps of the run</h3>{chart}"
            f'<div class="legend">{"".join(legend)}</div>{note}')


def rank_chart(items: Sequence[ReportItem]) -> str:
    """Mean step time per rank, split by category: the slow rank and why."""
    ds = [it.diagnosis for it in items]
    cats: list[str] = []
    for d in ds:
        cats += [c for c in _shown(d, _categories(d)) if c not in cats]
    labels = [f"rank {d.rank}" if d.rank is not None else f"trace {i}" for i, d in enumerate(ds)]
    series = {c: [d.breakdown.get(c, 0.0) for d in ds] for c in cats}
    notes = [f"GPU busy {d.gpu_busy_pct:.0f} %" if d.gpu_busy_pct is not None else "" for d in ds]
    slow = max(range(len(ds)), key=lambda i: ds[i].steps.mean_ms)
    fast = min(range(len(ds)), key=lambda i: ds[i].steps.mean_ms)
    chart = svg.hstacked_bars(labels, series, COLORS, notes=notes, label="step time per rank")
    spread = ds[slow].steps.mean_ms - ds[fast].steps.mean_ms
    return (
        '<section id="ranks"><h2>Step time per rank</h2>'
        f"<p>Slowest: {_e(labels[slow])} ({_ms(ds[slow].steps.mean_ms)} per step); fastest: "
        f"{_e(labels[fast])} ({_ms(ds[fast].steps.mean_ms)}); spread {_ms(spread)}.</p>"
        f"{chart}{_legend(cats)}</section>"
    )


def _rules_by_id() -> dict[str, Rule]:
    return {r.id: r for r in all_rules()}


def rule_doc_path(rule_id: str) -> str:
    """The rule's page in the trainprof repository (generated from the rule's code)."""
    return f"{RULE_DOCS}/{rule_id}.md"


def finding_html(i: int, f: Finding) -> str:
    color = SEV_COLORS.get(f.severity, "#7a828e")
    # The link stays inside the report (its Rules section): a report read offline, or sent to
    # someone without the repository, has no docs folder beside it to link to.
    rule = (f'<a href="#rule-{_e(f.rule)}"><code>{_e(f.rule)}</code></a>'
            if f.rule in _rules_by_id() else f"<code>{_e(f.rule)}</code>")
    bits = [rule]
    if f.location:
        bits.append("at " + " → ".join(f"<code>{_e(x)}</code>" for x in [f.location, *f.via]))
    saving = saving_text(f)
    bits.append(f"est. saving {_e(saving)}" if saving != "-" else "no saving claimed")
    if f.at:
        bits.append(f"{len(f.at)} occurrence{'s' if len(f.at) != 1 else ''} on the timeline")
    if f.ranks:
        bits.append("ranks " + _e(", ".join(str(r) for r in f.ranks)))
    return (
        f'<div class="finding" style="border-left-color:{color}">'
        f'<h3><span class="sev" style="background:{color}">{_e(f.severity)}</span>'
        f"{i}. {_e(f.title)}</h3>"
        f'<p class="meta">{" · ".join(bits)}</p>'
        f"<p>{_e(f.evidence)}</p>"
        f"<div><b>Fix</b><pre><code>{_e(f.fix)}</code></pre></div></div>"
    )


def diagnosis_html(item: ReportItem) -> str:
    d = item.diagnosis
    parts = [
        f"<p><b>Device:</b> {_e(device_line(d))}<br><b>Steps:</b> {_e(step_line(d))}</p>",
        breakdown_chart(item),
        f"<h3>Findings ({len(d.findings)})</h3>",
        f'<p class="meta">{_e(saving_header(d).capitalize())}</p>',
    ]
    if d.findings:
        parts += [finding_html(i, f) for i, f in enumerate(d.findings, 1)]
    else:
        parts.append("<p>No problems found.</p>")
    if d.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{_e(n)}</li>" for n in d.notes)
                     + "</ul>")
    return "".join(parts)


def rules_html(items: Sequence[ReportItem]) -> str:
    """What each rule found in the report detects and its usual fix, from the rule registry
    (`trainprof rules`), with the path of its full page in the trainprof repository."""
    registry = _rules_by_id()
    used = sorted({f.rule for it in items for f in it.diagnosis.findings if f.rule in registry})
    if not used:
        return ""
    parts = [
        '<section id="rules"><h2>Rules</h2>',
        '<p class="meta">Each rule of the findings above, described here so the report stands '
        "alone (from trainprof's rule registry, as <code>trainprof rules</code> prints it). Its "
        "full page (why it costs, detection, how the saving is estimated) is "
        f"<code>{RULE_DOCS}/&lt;rule&gt;.md</code> in the trainprof repository, a path relative "
        "to the repository's root.</p>",
    ]
    for rid in used:
        r = registry[rid]
        parts.append(
            f'<div class="rule" id="rule-{_e(rid)}"><h3><code>{_e(rid)}</code></h3>'
            f"<p><b>Detects:</b> {_e(r.detects)}<br><b>Usual fix:</b> {_e(r.fix)}<br>"
            f"<b>Rule page:</b> <code>{_e(rule_doc_path(rid))}</code> (trainprof repository)"
            "</p></div>"
        )
    parts.append("</section>")
    return "".join(parts)


def _table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    thead = f"<thead><tr>{head}</tr></thead>" if any(headers) else ""
    body = "".join(
        "<tr>" + "".join(f"<td>{_e('-' if v is None else v)}</td>" for v in r) + "</tr>"
        for r in rows
    )
    return f"<table>{thead}<tbody>{body}</tbody></table>"


def _yn(v: bool | None) -> str:
    return "-" if v is None else "yes" if v else "no"


def meta_html(meta: RunMeta) -> str:
    """The run metadata written by `trainprof run`."""
    w = meta.window
    run_rows = [
        ("script", " ".join([meta.script, *meta.argv[1:]]) if meta.argv else meta.script),
        ("status", f"{meta.status} (exit code {meta.exit_code})"),
        ("wall time", f"{meta.wall_time_s:.1f} s"),
        ("started", getattr(meta, "started_at", "") or "-"),
        ("steps", f"{len(meta.step_times_s)} (step boundary: {meta.step_source})"),
        ("profiler window", f"wait {w.wait}, warmup {w.warmup}, active {w.active}, "
         f"repeat {w.repeat}; traced steps {', '.join(map(str, w.recorded_steps)) or '-'}"),
        ("torch", meta.torch_version or "-"),
        ("CUDA", meta.cuda_version or "-"),
        ("devices", ", ".join(meta.devices) or "CPU only"),
        ("CPU cores / torch threads", f"{meta.cpu_count or '-'} / {meta.torch_threads or '-'}"),
    ]
    if meta.world_size:
        run_rows.append(("rank / world size", f"{meta.rank} / {meta.world_size}"))
    parts = ['<section id="run"><h2>Run</h2>', _table(("", ""), run_rows)]
    if meta.dataloaders:
        parts.append("<h3>DataLoaders</h3>")
        parts.append(_table(
            ("dataset", "batch size", "num_workers", "pin_memory", "persistent_workers",
             "prefetch_factor", "created at", "objects / iterators", "left before the end",
             "made with autograd off"),
            ((d.dataset or "-", d.batch_size, d.num_workers, _yn(d.pin_memory),
              _yn(d.persistent_workers), d.prefetch_factor, d.location,
              f"{d.instances} / {d.iterators}", len(d.left_early), d.grad_off_iters)
             for d in meta.dataloaders),
        ))
    if meta.optimizers:
        parts.append("<h3>Optimizers</h3>")
        parts.append(_table(
            ("class", "foreach", "fused", "created at"),
            ((o.cls, _yn(o.foreach), _yn(o.fused), o.location) for o in meta.optimizers),
        ))
    if meta.metrics:
        parts.append("<h3>Metrics</h3>")
        parts.append(_table(
            ("class", "device", "nan_strategy", "created at"),
            ((m.cls, m.device, m.nan_strategy, m.location) for m in meta.metrics),
        ))
    f = meta.flags
    parts.append("<h3>Flags</h3>")
    parts.append(_table(("flag", "value"), [
        ("cudnn.benchmark", _yn(f.cudnn_benchmark)),
        ("cuda.matmul.allow_tf32", _yn(f.cuda_matmul_allow_tf32)),
        ("cudnn.allow_tf32", _yn(f.cudnn_allow_tf32)),
        ("float32_matmul_precision", f.float32_matmul_precision or "-"),
        ("autocast used", _yn(f.autocast_used)),
        ("GradScaler used", _yn(f.grad_scaler_used)),
        ("torch.compile used", _yn(f.compile_used)),
    ]))
    dyn = meta.dynamo
    if dyn is not None and dyn.events:
        parts.append(
            f"<h3>torch.compile: {dyn.compiles} compiles, {dyn.recompiles} recompiles, "
            f"{dyn.graph_breaks} graph breaks</h3>"
        )
        parts.append(_table(
            ("compile id", "step", "called at", "frame", "recompile reason", "graph breaks",
             "seconds"),
            ((e.compile_id, e.step, e.location, e.function, e.reason or "-", e.graph_breaks,
              f"{e.duration_s:.2f}") for e in dyn.events),
        ))
    warns = getattr(meta, "sync_warnings", None) or []
    if warns:
        parts.append("<h3>CUDA sync warnings (--sync-debug)</h3>")
        parts.append(_table(("where", "count", "message"),
                            ((s.location, s.count, s.message) for s in warns)))
    notes = getattr(meta, "notes", None) or []
    if notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    parts.append("</section>")
    return "".join(parts)


def _tiles(items: Sequence[ReportItem], meta: RunMeta | None) -> str:
    ds = [it.diagnosis for it in items]
    tiles = []
    if meta is not None and meta.step_times_s:
        tiles.append(_tile(str(len(meta.step_times_s)), "steps run"))
    if len(ds) == 1:
        d = ds[0]
        tiles.append(_tile(_ms(d.steps.mean_ms), f"mean traced step ({d.steps.count} traced)"))
        if d.gpu_busy_pct is not None:
            tiles.append(_tile(f"{d.gpu_busy_pct:.1f} %", "GPU busy in the steps"))
    else:
        slow = max(ds, key=lambda d: d.steps.mean_ms)
        who = f"rank {slow.rank}" if slow.rank is not None else _short(slow)
        tiles.append(_tile(_ms(slow.steps.mean_ms), f"mean step of the slowest ({who})"))
        tiles.append(_tile(str(len(ds)), "traces (ranks)"))
    findings = [f for d in ds for f in d.findings]
    tiles.append(_tile(str(len(findings)), "findings"))
    if findings:
        top = max(findings, key=lambda f: f.est_saving_ms_per_step)
        if top.est_saving_ms_per_step > 0:
            tiles.append(_tile(f"{top.est_saving_pct:.1f} %", "biggest est. saving"))
    return f'<div class="tiles">{"".join(tiles)}</div>'


def _short(d: Diagnosis) -> str:
    """File name and rank, for headings (the full path is in the section)."""
    name = PurePath(d.trace).name
    return f"{name} (rank {d.rank})" if d.rank is not None else name


def render_html(
    items: Sequence[ReportItem],
    title: str,
    meta: RunMeta | None = None,
    measured: dict | None = None,
) -> str:
    """The whole page. `meta` is the run's metadata (for multi-rank runs, any rank's);
    `measured` the run's try.json (`trainprof try`), shown after the diagnosis."""
    if not items:
        raise ValueError("render_html needs at least one diagnosis")
    body = [
        f"<header><h1>trainprof report: {_e(title)}</h1>",
        f'<p class="sub">{_e(", ".join(sorted({device_line(it.diagnosis) for it in items})))}'
        "</p>",
        _tiles(items, meta),
        "</header>",
    ]
    if len(items) > 1:
        body.append(rank_chart(items))
    if meta is not None and meta.step_times_s:
        body.append(f'<section id="steps"><h2>Steps</h2>{step_time_chart(meta)}</section>')
    for i, it in enumerate(items):
        name = _e(title_of(it.diagnosis))
        if len(items) == 1:
            body.append(f'<section class="trace"><h2>Diagnosis</h2><p class="sub">{name}</p>'
                        f"{diagnosis_html(it)}</section>")
        else:
            n = len(it.diagnosis.findings)
            body.append(f'<section class="trace"><details{" open" if i == 0 else ""}>'
                        f"<summary>{_e(_short(it.diagnosis))} · {n} finding"
                        f'{"s" if n != 1 else ""}</summary><p class="sub">{name}</p>'
                        f"{diagnosis_html(it)}</details></section>")
    body.append(rules_html(items))
    if measured is not None:
        from trainprof.report.tryout import try_html

        body.append(try_html(measured))
    if meta is not None:
        body.append(meta_html(meta))
    body.append("<footer>Generated by trainprof. Self-contained: no scripts, nothing fetched."
                "</footer>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # Nothing may load from the network: the report is read offline and attached to issues.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; img-src data:\">"
        f"<title>trainprof: {_e(title)}</title><style>{CSS}</style></head>"
        f"<body><main>{''.join(body)}</main></body></html>\n"
    )
