"""`trainprof try` results (try.json) as terminal text, Markdown (TensorBoard panel) and an HTML
section for report.html."""

from __future__ import annotations

import re
from html import escape
from pathlib import Path
from typing import Any

import msgspec

from trainprof.runmeta import TRY_NAME

TRY_SCHEMA = 1


def pace_text(doc: dict) -> str:
    """How the saving was measured, said under every table of results (tryfix/measure); try.json
    from before the blocks compared median steps."""
    n = doc.get("block_steps")
    if not n:
        return "saving = 1 - median step with the fix / median step without"
    return (
        "saving = 1 - step with the fix / step without, a step being the median over blocks of "
        f"{n} consecutive steps of their mean (steps that alternate long and short, as with "
        "workers that fall behind, count at their average)"
    )


def read_try(run: Path) -> dict | None:
    """RUN/try.json (written by `trainprof try`), or None."""
    path = Path(run) / TRY_NAME
    if not path.is_file():
        return None
    try:
        doc = msgspec.json.decode(path.read_bytes())
    except msgspec.DecodeError:
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == TRY_SCHEMA else None


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:+.1f} %"


def _ci(ci: list[float] | None) -> str:
    return "" if not ci else f"[{ci[0]:+.1f}, {ci[1]:+.1f}]"


def _measured(f: dict) -> str:
    if f.get("measured_pct") is None:
        return f.get("error") or f.get("reason") or "not run"
    how = (", switched in blocks" if f.get("switched")
           else ", taking turns with the baseline" if f.get("turns") else "")
    return f"{_pct(f['measured_pct'])} {_ci(f.get('ci_pct'))}{how}"


def how_text(f: dict[str, Any]) -> str:
    """How a fix compared with the baseline block by block inside its rounds was measured:
    switched off and on in one process (tryfix/switch), or in a process beside a baseline
    process, the two taking turns (tryfix/turns)."""
    switched = bool(f.get("switched"))
    sw = f["switched" if switched else "turns"]
    n, t, rounds = sw["block_steps"], sw["transition_steps"], f.get("rounds", 0)
    pairs = sum(len(r) for r in f.get("step_times_ms") or []) // max(n, 1)
    shared = [] if switched else sw.get("baseline_shared_with") or []
    where = (
        f"switched off and on between steps, in blocks of {n} timed steps (after {t} not timed) "
        f"inside each of its {rounds} rounds" if switched else
        f"in a process beside the baseline's, the two taking turns in blocks of {n} timed steps "
        f"(after {t} not timed), the other stopped with its DataLoader workers meanwhile, in "
        f"each of its {rounds} rounds"
        + (f" (the baseline's process shared with {len(shared)} other variant(s), each taking "
           "its turns with it in the same seconds)" if shared else "")
    )
    return (
        f"{where}: {_pct(f['measured_pct'])} is 1 - the median, over {pairs} pairs of adjacent "
        f"blocks, of the step with the fix over the step without (without: "
        f"{sw['without_median_ms']:.2f} ms, with: {f.get('median_ms', 0):.2f} ms)"
    )


def _header(doc: dict) -> str:
    base = doc.get("baseline") or {}
    med = base.get("median_ms")
    off = "trainprof's profiler off" if doc.get("script_profiler") else "profiler off"
    ran = base.get("steps_run") or []
    per = doc.get("steps_per_round")
    steps = f"{per} steps"
    if ran and per and max(ran) < per:  # the script stops itself before --steps (its own count)
        lo, hi = min(ran), max(ran)
        steps = f"{lo}{'' if lo == hi else f'-{hi}'} steps (where the script ends)"
    n = base.get("rounds", 0)
    evals = max((len(e) for e in base.get("eval_steps") or []), default=0)
    aside = f", nor the {evals} that evaluate" if evals else ""
    how = "torchrun" if doc.get("ranks_started_by") != "script" else "the script's own launch"
    job = f"the job of {doc['ranks']} ranks again ({how}, its slowest rank's step), " if (
        doc.get("ranks")) else ""
    return job + (
        f"baseline {med:.2f} ms/step ({off}), " if med is not None else ""
    ) + (
        f"{n} round{'' if n == 1 else 's'} of {steps}, the first "
        f"{doc.get('warmup_steps_discarded')} of each not timed{aside}"
    )


def machine_text(doc: dict[str, Any]) -> list[str]:
    """The machine's speed in the baseline's rounds against the run's (tryfix/machine), and the
    baseline's step against the run's; a sentence where the rounds ran at a speed the run did
    not see most of the time, one where other processes loaded the machine differently, and
    one where the hypervisor held its CPUs more or less (steal). Empty where none was timed (a
    GPU run without load figures, older files)."""
    out = []
    m = doc.get("machine")
    if m and m.get("ratio"):
        out.append(
            f"a fixed piece of work between steps took {m['rounds_ref_ms']:.3f} ms in the "
            f"baseline's rounds, {m['run_ref_ms']:.3f} ms in the run ({m['ratio']:.2f}x)"
        )
    base = (doc.get("baseline") or {}).get("median_ms")
    run = doc.get("run_step_ms")
    if base and run and doc.get("run_step_basis") == "unprofiled":
        out.append(f"the baseline's step {base:.2f} ms, the run's {run:.2f} ms without the "
                   f"profiler, the estimates' basis ({base / run:.2f}x)")
    lines = ["; ".join(out)] if out else []
    if m and m.get("moved"):
        lo, hi = m["run_ref_range_ms"]
        here = m["rounds_ref_ms"]
        where = (
            f"outside the {lo:.3f}-{hi:.3f} ms the run saw 80 % of the time"
            if here < lo or here > hi
            else f"{here:.3f} ms against the run's typical {m['run_ref_ms']:.3f} ms"
        )
        lines.append(
            f"the rounds saw the machine {'slower' if m['ratio'] > 1 else 'faster'} than the "
            f"run did ({where}): the estimates were made at the run's speed and may not hold at "
            "this one; run and try again when the machine is as it was to compare them"
        )
    if m and m.get("load_differs"):
        run, here = m["run_other_cpus"], m["rounds_other_cpus"]
        lines.append(
            f"other processes kept {run:.2f} of {m['cpus']} CPUs busy during the run, "
            f"{here:.2f} during the rounds: the estimates were made on a "
            f"{'busier' if run > here else 'quieter'} machine, and what uses every core "
            "(intra-op threads, fused kernels, DataLoader workers) gains differently with "
            "cores taken; run and try again under the same load to compare them"
        )
    if m and m.get("steal_differs"):
        run, here = m["run_steal_share"], m["rounds_steal_share"]
        lines.append(
            f"the hypervisor held the CPUs for {100 * run:.0f} % of the time they wanted to run "
            f"during the run, {100 * here:.0f} % during the rounds (steal: other virtual "
            f"machines on this host): the estimates were made on a "
            f"{'busier' if run > here else 'quieter'} host, at another speed than the rounds'; "
            "run and try again when the host is as it was to compare them"
        )
    return lines


def outputs_text(doc: dict[str, Any]) -> list[str]:
    """What the rounds did with the script's records (tryfix/outputs): the script's own profiler
    (ran, wrote no file) and the paths written to each round's own folder instead; and the
    earlier tries' results kept beside try.json."""
    lines = []
    sp = doc.get("script_profiler")
    if sp:
        started, files = sp.get("started") or [], sp.get("unwritten") or []
        kind = f" ({' and '.join(started)})" if started else ""
        text = (
            f"the script's own profiler{kind} ran in the rounds as in the run (its cost is in "
            "every variant's steps)"
        )
        if files:
            text += f"; the rounds wrote none of its files ({_some(files)})"
        lines.append(text)
    moved = doc.get("redirected") or []
    if moved:
        lines.append(
            "the rounds wrote the script's checkpoints, logs and files into a folder of each "
            f"round's own, deleted after it, instead of {_some(moved)}"
        )
    if (sp and sp.get("unwritten")) or moved:
        lines.append("what the run wrote is as it was")
    earlier = doc.get("earlier") or []
    if earlier:
        lines.append(f"earlier tries' results in the run folder: {', '.join(earlier)}")
    return lines


def _verdict(f: dict[str, Any]) -> str:
    """The verdict for a table cell, with `rounds_to_tell` where the rounds could not tell."""
    v = f.get("verdict") or "—"
    if not f.get("rounds_to_tell"):
        return v
    return f"{v} (cannot tell the estimate from 0: {_rounds(f)} rounds would)"


def _rounds(f: dict[str, Any]) -> str:
    """"about k" rounds, or "more than k - 1" beyond what rounds_to_tell counts to."""
    k = f["rounds_to_tell"]
    return f"more than {k - 1}" if f.get("rounds_to_tell_beyond") else f"about {k}"


def tell_text(f: dict[str, Any]) -> str:
    """What `rounds_to_tell` means for a fix whose rounds could not tell its estimate from 0."""
    k, est = f["rounds_to_tell"], _pct(f.get("estimated_pct"))
    head = f"these rounds cannot tell {est} from 0 on this machine (the interval holds both)"
    if f.get("rounds_to_tell_beyond"):
        return f"{head}; at their spread {_rounds(f)} rounds would be needed"
    return f"{head}; at their spread {_rounds(f)} rounds would (--rounds {k})"


def _some(paths: list[str]) -> str:
    return paths[0] + (f" and {len(paths) - 1} more" if len(paths) > 1 else "")


def _basis(c: dict[str, Any]) -> str:
    """How the estimate of all fixes together was made (tryfix/estimates)."""
    if c.get("estimated_pct") is None:
        return ""
    less = c.get("estimate_less_pct")
    if not less:
        cost = ""
    elif c.get("cpu_bf16_own_layout"):
        cost = f", less {less:.1f} % that cpu-bf16's fix saves less in the model's own layout"
    else:
        cost = (f", less {less:.1f} % that a fused optimizer takes more on the channels-last "
                "weights of cpu-bf16's fix")
    if c.get("estimate_basis") == "model":
        return f" (the DataLoader model, the other fixes' savings{cost} taken off its compute)"
    over = c.get("estimate_idle_over_pct")
    if over:
        cost += (f", less {over:.1f} % by which the fixes of the host's side exceed the GPU "
                 f"idle of the step without the profiler ({c.get('gpu_idle_bound_pct', 0):.1f} "
                 "%), which they remove at most")
    return f" (the sum of the estimates{cost})"


def _own_layout(c: dict[str, Any]) -> str:
    """Where the fixes together keep the model's own layout under cpu-bf16's fix (alone it
    makes the model channels-last)."""
    if not c.get("cpu_bf16_own_layout"):
        return ""
    return ("; cpu-bf16's fix in the model's own layout there (no channels_last): the fused "
            "optimizer runs slower on channels-last weights than bf16 gains from them")


def render_try_text(doc: dict[str, Any]) -> str:
    """The table `trainprof try` prints."""
    lines = ["", "trainprof try: measured, not estimated — " + _header(doc)]
    if doc.get("interrupted"):
        lines.append("(interrupted: the rounds done so far)")
    if doc.get("stopped_early"):
        lines.append(f"(stopped early: {doc['stopped_early']})")
    if doc.get("estimates_note"):
        lines.append(f"({doc['estimates_note']})")
    for i, line in enumerate(machine_text(doc)):
        lines.append(("machine: " if i == 0 else "note: ") + line)
    lines += ["note: " + line for line in outputs_text(doc)]
    for f in doc.get("fixes", []):
        lines.append("")
        lines.append(f"  {f['rule']}: {f.get('verdict') or '—'}")
        lines.append(f"    changed:   {f['change']}")
        est = _pct(f.get("estimated_pct"))
        if f.get("estimate_note"):  # a finding that claims no saving: not an estimate of 0
            est += f" ({f['estimate_note']})"
        spread = f.get("estimated_spread_pct")
        if spread:
            est += f" ({spread[0]:.1f}-{spread[1]:.1f} % within the run's own noise)"
        if "suggested_estimated_pct" in f:  # the sweep's best is not the diagnosis's suggestion
            count = re.search(r"num_workers=\d+", f["suggested_change"])
            est += (f" (the diagnosis's model, for this change; it suggested "
                    f"{count.group(0) if count else f['suggested_change']}: "
                    f"{_pct(f['suggested_estimated_pct'])})")
        lines.append(f"    estimated: {est}")
        if f.get("verdict") != "edit the code":
            lines.append(f"    measured:  {_measured(f)}")
        if (f.get("switched") or f.get("turns")) and f.get("measured_pct") is not None:
            lines.append(f"    how:       {how_text(f)}")
        if f.get("rounds_to_tell"):
            lines.append(f"    note:      {tell_text(f)}")
        if f.get("workers_pct") is not None:
            lines.append(
                f"      of which the thread change alone {_pct(f.get('threads_only_pct'))} "
                f"{_ci(f.get('threads_only_ci_pct'))} (depends on the machine's load), the "
                f"workers {_pct(f['workers_pct'])} {_ci(f.get('workers_ci_pct'))} "
                + ("(the estimate is for both: the model was timed with fewer threads)"
                   if f.get("estimate_includes_threads") else "(what the estimate is for)")
            )
        for v in f.get("variants", []):
            shown = _measured(v) if "measured_pct" in v or "error" in v else "not run"
            if v.get("estimated_pct") is not None:
                spread = v.get("estimated_spread_pct")
                within = (f", {spread[0]:.1f}-{spread[1]:.1f} % within the run's own noise"
                          if spread else "")
                shown += f" (estimated {_pct(v['estimated_pct'])}{within})"
            lines.append(f"      · {v['change']}: {shown}")
        for note in f.get("notes", []):
            lines.append(f"    note:      {note}")
        if f.get("warmup_steps_discarded"):
            lines.append(f"    note:      the first {f['warmup_steps_discarded']} steps of each "
                         "round not timed (compilation)")
        if f.get("recompile_steps"):
            steps = sorted({s for r in f["recompile_steps"] for s in r})
            lines.append(f"    note:      torch.compile compiled again at step(s) "
                         f"{', '.join(map(str, steps))} (those steps and the next not timed; a "
                         "script that keeps recompiling pays that time on every recompile)")
        if f.get("permanent_fix"):
            lines.append(f"    in code:   {f['permanent_fix']}")
    c = doc.get("combined")
    if c:
        lines.append("")
        if c.get("rules"):
            lines.append(f"  all together ({', '.join(c['rules'])}): estimated "
                         f"{_pct(c.get('estimated_pct'))}{_basis(c)}, measured {_measured(c)}"
                         f"{_own_layout(c)}")
        else:
            lines.append(f"  all together: {c.get('note', '')}")
    lines.append("")
    lines.append(f"  {pace_text(doc)}; 95 % interval over rounds and blocks; positive is faster")
    return "\n".join(lines) + "\n"


def render_try_markdown(doc: dict[str, Any]) -> str:
    rows = ["| fix | change | estimated | measured (95 % CI) | verdict |", "|---|---|---|---|---|"]
    for f in doc.get("fixes", []):
        rows.append(
            f"| {f['rule']} | `{f['change']}` | {_pct(f.get('estimated_pct'))} | "
            f"{_measured(f) if f.get('verdict') != 'edit the code' else '—'} | "
            f"{_verdict(f)} |"
        )
    c = doc.get("combined")
    if c and c.get("rules"):
        rows.append(f"| all together | {', '.join(c['rules'])} | {_pct(c.get('estimated_pct'))}"
                    f"{_basis(c)} | {_measured(c)}{_own_layout(c)} | |")
    machine = "".join(f"\n\n{line}" for line in machine_text(doc) + outputs_text(doc))
    return f"**trainprof try** — {_header(doc)}{machine}\n\n" + "\n".join(rows) + "\n"


def try_html(doc: dict[str, Any]) -> str:
    """The report.html section."""
    e = escape
    rows = []
    for f in doc.get("fixes", []):
        measured = _measured(f) if f.get("verdict") != "edit the code" else "—"
        rows.append(
            f"<tr><td>{e(f['rule'])}</td><td><code>{e(f['change'])}</code></td>"
            f"<td>{e(_pct(f.get('estimated_pct')))}</td><td>{e(measured)}</td>"
            f"<td>{e(_verdict(f))}</td>"
            f"<td><code>{e(f.get('permanent_fix') or '')}</code></td></tr>"
        )
    c = doc.get("combined")
    if c and c.get("rules"):
        rows.append(f"<tr><td>all together</td><td>{e(', '.join(c['rules']))}</td>"
                    f"<td>{e(_pct(c.get('estimated_pct')) + _basis(c))}</td>"
                    f"<td>{e(_measured(c) + _own_layout(c))}</td>"
                    "<td></td><td></td></tr>")
    head = ("<tr><th>fix</th><th>change</th><th>estimated</th><th>measured (95 % CI)</th>"
            "<th>verdict</th><th>in code</th></tr>")
    note = " (interrupted: the rounds done so far)" if doc.get("interrupted") else ""
    notes = machine_text(doc) + outputs_text(doc)
    return (
        '<section id="try"><h2>Fixes measured (trainprof try)</h2>'
        f'<p class="sub">{e(_header(doc))}{e(note)}; {e(pace_text(doc))}; positive is faster.</p>'
        + "".join(f'<p class="sub">{e(line)}.</p>' for line in notes)
        + f"<table>{head}{''.join(rows)}</table></section>"
    )
