"""gpu-idle: the GPU has no work while the CPU runs code that no other rule explains.

Why it costs: work the CPU does between launches (input preprocessing in the training loop,
Python bookkeeping, CPU tensor ops, logging, checkpoint I/O, CUDA set-up) runs on the step's
critical path whenever the GPU has nothing queued: the GPU idles for all of it.

Detection: what is left of the GPU idle inside the steps after every cause-specific rule took its
share: DataLoader fetches, host waits and refills (Context.attribution) and dispatch gaps
(`launch-bound`, see `analysis/dispatch.py`), and what `optimizer-foreach` / `zero-grad-not-none`
claimed; idle between the kernels of one CUDA-graph replay is neither (no host work could fill
it) and is left out. So is idle whose next GPU work had already been launched (`queued`,
`analysis/queued.py`): at the edge of a window when the GPU lags the CPU (work queued before the
window or before the recording began), or when the host finished launching long before the GPU
ran it (a graph replay, a deep queue) and the GPU stalled on something the trace does not show.
No host code made the GPU wait there; the diagnosis says how much of it there was in a note, and
names the steps that are GPU-bound (busy from their first GPU work to their end, but for
switches between queued kernels: host-side fixes will not speed them up). The longest idle gaps
are sampled (a few points
each, on the training thread) and named by the deepest Python frame common to all samples of a
gap (`with_stack` traces), else by the `Call stack` of the running operator (2021 traces), else
by the host events open at that moment. trainprof's own frames and runpy's are left out (the
wrapper `trainprof run` puts around `opt.step()` stands for the step it wraps; runpy is how the
script was started), and a user frame is the same frame at whatever line it ran (a loop at
module level runs several in one gap): it is named by its file and the lines its samples ran,
the finding pointing at the line that ran in most of the idle. A library frame is named by the
`record_function` range open around it (`Optimizer.step#Adam.step`) or else the `nn.Module`
whose forward ran it. Gaps with the same name are summed; each name above
5 % of the step is one finding (at most 3), the remainder one more if it is above 3 %.

Saving estimate: the idle time itself, per step: what moving that work off the critical path
(DataLoader workers, a background thread, the GPU) can recover at most.
"""

from __future__ import annotations

import re

import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.dispatch import compiled
from trainprof.analysis.hoststack import NO_OP, GapGroup, group_gaps
from trainprof.analysis.ledger import ledger
from trainprof.analysis.model import Finding
from trainprof.rules import Rule
from trainprof.rules._util import finding, ms
from trainprof.trace.frames import (
    first_user_frame,
    frame_location,
    is_user_file,
    parse_any_frame,
    parse_frame,
)

MIN_GROUP_PCT = 5.0
MIN_REST_PCT = 3.0
MAX_FINDINGS = 3
SAMPLED_GAPS = 64
MAX_LINES = 4

PREPROCESS = re.compile(
    r"(?i)preprocess|transform|tokeni[sz]|decode|collate|augment|image_process|feature_extract"
    r"|frombytes|imread|read_video|resize|normali[sz]e|rescale"
)
SETUP = re.compile(
    r"^(cuda|hip)(DeviceGetStreamPriorityRange|Malloc|Free|HostAlloc|StreamCreate\w*|"
    r"EventCreate\w*|GetDevice\w*|FuncGetAttributes|LaunchKernel|ModuleLoad\w*)$|^cu(Module|Ctx)"
)

FIX_PREPROCESS = (
    "Move preprocessing off the critical path: do it in DataLoader workers "
    "(`DataLoader(dataset_with_transforms, num_workers=4, persistent_workers=True, "
    "pin_memory=True)`), on the GPU (torchvision.transforms.v2 on CUDA tensors), or overlap it "
    "with the previous batch (prepare batch N+1 in a background thread while the GPU runs N)."
)
FIX_SETUP = (
    "One-off CUDA set-up (context creation, allocator growth, module loading) ran inside the "
    "profiled window: profile after warm-up (`schedule(wait=1, warmup=2, active=3)`); if it "
    "repeats every step, keep shapes fixed and drop `torch.cuda.empty_cache()` from the loop."
)
FIX_GENERIC = (
    "Take this CPU work off the step: run it in a DataLoader worker or a background thread, "
    "every N steps instead of every step, or on the GPU; `torch.compile` removes Python "
    "overhead between ops."
)
FIX_GENERIC_COMPILED = (
    "Take this CPU work off the step: run it in a DataLoader worker or a background thread, "
    "every N steps instead of every step, or on the GPU; if it is Python between compiled "
    "regions, find the graph breaks (`TORCH_LOGS=graph_breaks`)."
)
FIX_NO_OP = (
    "Record the Python stack to name this code (`torch.profiler.profile(with_stack=True)`, or "
    "`trainprof run`), then take it off the step: background thread, DataLoader worker, every "
    "N steps, or on the GPU."
)


def _lines(lines: list[int]) -> str:
    return f"line {lines[0]}" if len(lines) == 1 else "lines " + ", ".join(map(str, lines))


def _what(grp: GapGroup, brief: bool = False) -> str:
    """The code a group ran, for a person: a user frame by its file and line(s) (a loop at
    module level has no function to name), a library frame by the record_function range open
    around it (`Optimizer.step#Adam.step`) or the nn.Module whose forward ran it when there is
    one, with its function and place unless `brief` (a title: the evidence has them); an
    operator by its name."""
    if grp.source == "none":
        return NO_OP.lower()
    p = parse_any_frame(grp.label)
    if p is None:
        return grp.label
    file, line, func = p
    if is_user_file(file):
        # The lines that ran in most of the idle first, at most 4, then in source order.
        lines = sorted(sorted(grp.lines, key=lambda k: -grp.lines[k])[:MAX_LINES])
        if line is not None or len(lines) == 1:
            place = f"{file}:{line if line is not None else lines[0]}"
        else:
            place = f"{file} {_lines(lines)}" if lines else file
        return f"{place} (module level)" if func == "<module>" else f"{func} ({place})"
    around = grp.annotation or _module_of(grp)
    if around and brief:
        return around
    return f"{around} ({func}, {file}:{line})" if around else f"{func} ({file}:{line})"


def _module_of(grp: GapGroup) -> str:
    """The innermost `nn.Module: Name` frame between a library label and the user's code: the
    module whose forward ran the library code."""
    for f in grp.shared:
        if f.startswith("nn.Module: "):
            return f
        p = parse_any_frame(f)
        if p and is_user_file(p[0]):
            break
    return ""


def _location(grp: GapGroup) -> str | None:
    """The user's line: the label's own (its line that ran in the most idle), else the first
    user frame around it."""
    p = parse_any_frame(grp.label)
    line = grp.main_line()
    if p and line is not None and p[1] is None:
        return frame_location(f"{p[0]}({line}): {p[2]}")
    return first_user_frame(grp.shared)


def _generic(ctx: Context) -> str:
    return FIX_GENERIC_COMPILED if compiled(ctx) else FIX_GENERIC


def _fix(ctx: Context, grp: GapGroup) -> str:
    # Function names only: a path such as `transformers/...` says nothing about the work.
    funcs = [p[2] for p in map(parse_frame, grp.shared[:3]) if p]
    text = " ".join(funcs) if funcs else grp.label
    if grp.source == "none":
        return FIX_NO_OP
    if PREPROCESS.search(text):
        return FIX_PREPROCESS
    if SETUP.search(grp.label):
        return FIX_SETUP
    return _generic(ctx)


def _finding(ctx: Context, grp: GapGroup, gaps: tuple[np.ndarray, np.ndarray]) -> Finding:
    starts, ends = gaps
    idx = np.array(sorted(grp.gaps), np.int64)
    lengths = ends[idx] - starts[idx]
    saving = ctx.per_step(grp.idle_us)
    longest = int(idx[np.argmax(lengths)])
    step_k = int(np.searchsorted(ctx.steps.start, starts[longest], side="right")) - 1
    offset = starts[longest] - ctx.steps.start[max(step_k, 0)]
    what = _what(grp)
    evidence = (
        f"GPU idle {ms(saving)}/step ({ctx.pct(saving):.1f} % of the step) while the training "
        f"thread ran {what}: {len(idx)} gap(s), the longest {ms(float(lengths.max()))} starting "
        f"{ms(float(offset))} into its step."
    )
    if grp.source == "ops":
        evidence += " (Named by the operators open then: the trace has no Python stacks.)"
    loc = _location(grp) if grp.source in ("python", "callstack") else None
    title = (
        f"GPU idle while the CPU runs {_what(grp, brief=True)}: {ctx.pct(saving):.0f} % of the step"
    )
    if grp.source == "none":
        title = f"GPU idle during Python code between ops: {ctx.pct(saving):.0f} % of the step"
    f = finding(
        ctx,
        rule="gpu-idle",
        title=title,
        evidence=evidence,
        fix=_fix(ctx, grp),
        saving_us_per_step=saving,
        location=loc,
        metrics={
            "idle_ms_per_step": round(saving / 1000, 3),
            "gaps": len(idx),
            "longest_gap_ms": round(float(lengths.max()) / 1000, 3),
            "longest_gap_offset_ms": round(float(offset) / 1000, 3),
            "frame": grp.label,
            "frame_source": grp.source,
        },
    )
    f.at = [[float(starts[i]), float(ends[i] - starts[i])] for i in idx[:200].tolist()]
    return f


def check(ctx: Context) -> list[Finding]:
    if not ctx.gpu_timeline or not ctx.on_gpu:
        return []
    gaps = ledger(ctx).host
    total = ctx.per_step(float((gaps[1] - gaps[0]).sum()))
    if ctx.pct(total) < MIN_REST_PCT:
        return []
    out: list[Finding] = []
    groups = group_gaps(ctx, gaps, SAMPLED_GAPS)
    named = [g for g in groups[:MAX_FINDINGS] if ctx.pct(ctx.per_step(g.idle_us)) >= MIN_GROUP_PCT]
    out = [_finding(ctx, g, gaps) for g in named]
    rest = total - ctx.per_step(sum(g.idle_us for g in named))
    if ctx.pct(rest) < MIN_REST_PCT:
        return out
    n = len(gaps[0]) / max(ctx.n_steps, 1)
    others = [g for g in groups if g not in named][:3]
    places = ", ".join(f"{_what(g)} {ctx.pct(ctx.per_step(g.idle_us)):.1f} %" for g in others)
    evidence = (
        f"GPU idle {ms(rest)}/step ({ctx.pct(rest):.1f} % of the step) in ~{n:.0f} host gaps per "
        "step that neither the DataLoader, host waits nor launch overhead explain"
        + (", outside the places named in the other gpu-idle findings" if named else "")
        + (f"; the largest: {places}." if places else ".")
    )
    top = others[0] if others else None
    out.append(
        finding(
            ctx,
            rule="gpu-idle",
            title=f"GPU idle spread over many host gaps: {ctx.pct(rest):.0f} % of the step",
            evidence=evidence,
            fix=FIX_NO_OP if top is not None and top.source == "none" else _generic(ctx),
            saving_us_per_step=rest,
            location=_location(top) if top is not None else None,
            metrics={
                "idle_ms_per_step": round(rest / 1000, 3),
                "gaps_per_step": round(n, 1),
                "frame": top.label if top is not None else "",
            },
        )
    )
    return out


RULE = Rule(
    id="gpu-idle",
    detects="The GPU idles while the CPU runs other code (preprocessing, Python, CPU ops).",
    fix="Move that CPU work off the step: DataLoader workers, a background thread, the GPU.",
    check=check,
)
