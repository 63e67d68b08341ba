"""launch-bound: the GPU waits for the CPU to launch many tiny kernels.

Why it costs: every eager PyTorch op pays a fixed CPU price (Python, the dispatcher, the
allocator, `cudaLaunchKernel`: tens of µs) before its kernel can start. When the kernels are
shorter than that price (small models, small batches, element-wise chains, per-parameter
optimizer loops) the GPU finishes each kernel before the next is launched and idles in between,
however fast it is.

Detection (HolisticTraceAnalysis' "host wait" idle and kernel launch statistics): the GPU idle
left after DataLoader, host waits and refills (`other`) is split by `analysis/dispatch.py`; the
part that falls while the host is inside an operator that launches GPU work (or within 100 µs of
Python glue between two of them), in gaps shorter than 1 ms, is this rule's. Longer gaps and idle
while the host does something else go to `gpu-idle`; idle that `optimizer-foreach` or
`zero-grad-not-none` explain (per-parameter launch gaps) is theirs, not counted here. Evidence:
kernels per step, median kernel vs median launch-call duration, the share of kernels that ran
shorter than their launch call, the launch delay (launch end to kernel start: a few µs when the
GPU is starved, milliseconds when it is the bottleneck), and the operators during which the idle
happened.

On a CPU-only trace there is no launch, but the same fixed per-op cost dominates when the step
is a long chain of tiny ops: reported (severity low, no saving claimed) when the median top-level
op takes under 20 µs and the median step, its DataLoader fetches and optimizer steps taken out,
holds one top-level op per 100 µs or less. The ops inside fetches (per-sample transforms run in
the loop with num_workers=0) and inside optimizer.step() are not counted: they are
`dataloader-starvation`'s and `optimizer-foreach`'s, and torch.compile of the model does not
touch them. Counting them made the rule fire on every fetch-bound CNN example (1229 of try_jpeg's
1260 "tiny ops" per step were its fetch's) with a fix that cannot remove them.

Why no saving on a CPU: what torch.compile saves there was measured (`trainprof try RUN --fix
launch-bound`, one intra-op thread, 2-core EPYC) and does not follow from the per-op overhead
the trace shows. On try_mlp (20 ops of median 5.7 µs in forward and backward) it made the step
slower (0.22 -> 0.31 ms outside the fetch, standalone; -36 % in `try`): the compiled call's own
fixed cost (Dynamo's guards, the AOTAutograd wrapper, forward and backward) exceeds the
dispatch cost of the ops it replaces, and that fixed cost cannot be measured without compiling,
which takes seconds (over a probe's budget). On the conv-BN-ReLU example it saved about 13 %
(fused BatchNorm/ReLU arithmetic, not per-op overhead), on the conv-ReLU quickstart it cost
time, on the Hugging Face example's small BERT it saved +8.5 % [+7.7, +11.8] (2-vCPU Intel VM,
2026-11-29): the sign depends on the model, not on what this rule detects. The finding's
`metrics["kind"]` is "cpu-overhead", and `trainprof try` shows its measurement beside "not
estimated", not beside an estimate of 0.

When the step is already compiled (`CompiledFunction` ops, or `compile_used` in the run
metadata), the fix offered is CUDA graphs and graph-break hunting rather than `torch.compile`
(on a CPU: a larger batch and graph-break hunting); when it already replays CUDA graphs, the
graph breaks and the ops left outside the graphs. Kernels replayed from a CUDA graph are no
launch overhead (`analysis/dispatch.py`): their idle and their count are left out.

Saving estimate: the launch-bound idle per step. An upper bound: CUDA graphs (torch.compile
mode="reduce-overhead") remove the per-kernel CPU cost entirely, fusion and a larger batch
remove part of it. So on a GPU `trainprof try --fix launch-bound` measures both torch.compile's
default mode and mode="reduce-overhead" and keeps the better: on an H100 the default mode took
nothing measurable off amp_compile's host-bound CNN (estimated 38.7 %, measured -8.8 % in two
rounds, [-145, +127]).
"""

from __future__ import annotations

import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.dispatch import compiled, launch_stats, split_other
from trainprof.analysis.kinds import CPU_OVERHEAD
from trainprof.analysis.ledger import ledger
from trainprof.analysis.model import Finding
from trainprof.analysis.overhead import busiest_location, cpu_ops, idle_by_op
from trainprof.rules import Rule
from trainprof.rules._util import finding, ms
from trainprof.trace import intervals as iv

MIN_PCT = 3.0  # % of the step below which launch overhead is not worth a finding
STARVED_DELAY_US = 20.0  # a median launch delay under this: nothing queued, the GPU is starved
CPU_TINY_OP_US = 20.0
CPU_OP_SLOT_US = 100.0

FIX = (
    "Launch fewer, bigger kernels: `model = torch.compile(model)` (fuses element-wise chains), "
    'or `torch.compile(model, mode="reduce-overhead")` to replay the step as a CUDA graph; '
    "a larger batch (fixed per-step overhead, more work per kernel); "
    "`torch.optim.AdamW(params, fused=True)` (or foreach=True) instead of a per-parameter loop."
)
FIX_COMPILED = (
    "The step is already compiled: replay it as a CUDA graph with "
    '`torch.compile(model, mode="reduce-overhead")` (static shapes), use a larger batch, and '
    "`fused=True` optimizers; check for graph breaks (`TORCH_LOGS=graph_breaks`) that leave "
    "eager ops between compiled regions."
)
FIX_GRAPHED = (
    "The step already replays CUDA graphs: the gaps are in the eager ops around them. Find the "
    "graph breaks (`TORCH_LOGS=graph_breaks`) and the ops outside the compiled region (the "
    "optimizer step: `fused=True`, or compile it too), and use a larger batch."
)
CPU_FIX = (
    "Per-op overhead dominates: batch more samples per step (the same ops do more work each), "
    "fewer Python-level ops in the loop; `torch.compile(model)` fuses the small ops but adds a "
    "fixed cost per call: measure it first (`trainprof try RUN --fix launch-bound`)."
)
CPU_FIX_COMPILED = (
    "Per-op overhead dominates although the step is compiled: batch more samples per step; find "
    "the graph breaks that leave eager ops between compiled regions (`TORCH_LOGS=graph_breaks`, "
    "`torch._dynamo.explain(model)(batch)`) and the ops outside the compiled call (the optimizer: "
    "`foreach=True`)."
)


def _gpu(ctx: Context) -> list[Finding]:
    split = split_other(ctx)
    idle = ledger(ctx).launch
    saving = ctx.per_step(iv.total(idle))
    if ctx.pct(saving) < MIN_PCT:
        return []
    st = launch_stats(ctx)
    per_step = st.kernels / max(ctx.n_steps, 1)
    gaps = int(len(idle[0]) / max(ctx.n_steps, 1))
    by_op = idle_by_op(ctx, idle)
    where = ", ".join(f"{n} {ms(v)}" for n, v in by_op.top)
    evidence = (
        f"GPU idle {ms(saving)}/step ({ctx.pct(saving):.1f} % of the step) in ~{gaps} short gaps "
        f"while the CPU dispatched ops; {per_step:.0f} kernels/step, median kernel "
        f"{st.median_kernel_us:.1f} µs vs median launch call {st.median_launch_us:.1f} µs, "
        f"{100 * st.short_share:.0f} % of kernels ran shorter than their launch; median launch "
        f"delay {st.median_delay_us:.1f} µs"
        + (
            " (kernels start as soon as they are launched: the GPU waits for the CPU)."
            if st.median_delay_us < STARVED_DELAY_US
            else " (work queues up elsewhere in the step; these gaps are where it does not)."
        )
    )
    if where:
        evidence += f" Mostly during {where} per step."
    claimed = ctx.per_step(iv.total(split.launch) - iv.total(idle))
    if claimed > 0:
        evidence += f" ({ms(claimed)}/step more is in the optimizer findings.)"
    if st.graph_kernels:
        evidence += (
            f" {st.graph_kernels / max(ctx.n_steps, 1):.0f} kernels/step replayed from CUDA "
            "graphs are not counted: one launch replays them all."
        )
    fix = FIX
    if st.graph_kernels:
        fix = FIX_GRAPHED
    elif compiled(ctx):
        fix = FIX_COMPILED
    f = finding(
        ctx,
        rule="launch-bound",
        title=f"Launch-bound: the GPU waits for kernel launches, {ctx.pct(saving):.0f} % of "
        "the step",
        evidence=evidence,
        fix=fix,
        saving_us_per_step=saving,
        location=by_op.location,
        metrics={
            "idle_ms_per_step": round(saving / 1000, 3),
            "kernels_per_step": round(per_step, 1),
            "graph_kernels_per_step": round(st.graph_kernels / max(ctx.n_steps, 1), 1),
            "median_kernel_us": round(st.median_kernel_us, 2),
            "median_launch_us": round(st.median_launch_us, 2),
            "short_kernel_share": round(st.short_share, 3),
            "median_launch_delay_us": round(st.median_delay_us, 2),
            "p90_launch_delay_us": round(st.p90_delay_us, 2),
            "launch_delay_outliers": st.delay_outliers,
            "runtime_outliers": st.runtime_outliers,
            "gpu_busy_pct": round(ctx.gpu_busy_pct or 0.0, 2),
        },
    )
    order = np.argsort(-(idle[1] - idle[0]), kind="stable")[:200]
    f.at = [[float(idle[0][i]), float(idle[1][i] - idle[0][i])] for i in np.sort(order)]
    return [f]


def _cpu(ctx: Context) -> list[Finding]:
    c = cpu_ops(ctx)
    if c is None or c.median_op_us >= CPU_TINY_OP_US or c.slot_us > CPU_OP_SLOT_US:
        return []
    per_step, med, step_us, slot = c.per_step, c.median_op_us, c.median_step_us, c.slot_us
    aside = (
        f" ({c.left_out:.0f} more in DataLoader fetches and optimizer steps are left to those "
        "findings)"
        if c.left_out >= 0.5
        else ""
    )
    return [
        finding(
            ctx,
            rule="launch-bound",
            title=f"Framework overhead: {per_step:.0f} tiny ops per step (median {med:.1f} µs)",
            evidence=f"The median step ({ms(step_us)}) runs {per_step:.0f} top-level ops of median "
            f"{med:.1f} µs outside DataLoader fetches and optimizer steps{aside}: one op per "
            f"{slot:.0f} µs of the rest of the step, so the time goes to fixed per-op and Python "
            "overhead rather than arithmetic. On a GPU each op would be a kernel launch. No "
            "saving is claimed: torch.compile removes part of this per-op cost but adds a fixed "
            "cost of its own to every compiled call (guard checks, the autograd wrapper), which "
            "on a CPU step this small can outweigh what it removes; `trainprof try RUN --fix "
            "launch-bound` measures it on this script.",
            fix=CPU_FIX_COMPILED if compiled(ctx) else CPU_FIX,
            saving_us_per_step=0.0,
            severity="low",
            location=busiest_location(ctx, c.ops),
            metrics={
                "kind": CPU_OVERHEAD,  # no saving claimed: `trainprof try` says "not estimated"
                "ops_per_step": round(per_step, 1),
                "median_op_us": round(med, 2),
                "us_per_op": round(slot, 1),
                "median_step_ms": round(step_us / 1000, 3),
                "ops_left_out_per_step": round(c.left_out, 1),
            },
            at=c.ops.tolist(),
        )
    ]


def check(ctx: Context) -> list[Finding]:
    if ctx.gpu_timeline:
        return _gpu(ctx)
    if ctx.device.kind == "cpu":
        return _cpu(ctx)
    return []  # GPU listed but no GPU timeline, or a non-CUDA accelerator: nothing to measure


RULE = Rule(
    id="launch-bound",
    detects="The GPU idles between tiny kernels while the CPU dispatches and launches them.",
    fix='torch.compile(model) (mode="reduce-overhead" for CUDA graphs), larger batch, fused '
    "optimizers.",
    check=check,
)
