"""Whether `trainprof try`'s rounds saw the machine at the speed the run did.

An estimate is made from the run's steps and its after-run probes; `try` measures minutes or
days later. On a shared VM the machine itself moves between them: this 2-core VM ran a fixed
piece of work in 0.10 ms for whole sessions and in 0.16 ms for others, and the figures the
estimates divide move with it unevenly (the Hugging Face Trainer example's DataLoader estimate
was 0-12 % in one session, 0 % in all sixteen runs of the next). A measurement taken at another
speed than its estimate then checks a different machine, and the rounds' interval, taken within
`try`, cannot see it.

So each CPU round times the run's reference at its step boundaries (capture/phaseref, as the
run does after its profiling window), and the baseline's rounds (the script as the run ran it:
the variants' workers would slow the reference beside them) are set against the run's: the
ratio of their medians, and `moved` where the rounds' median lies outside the range the run saw
most of the time (its 10th-90th percentile) by more than TOLERANCE. A run that saw both speeds
has a range that holds both (most do here: 10th to 90th percentile 1.4-1.7x apart in 27 of 31
runs of one session), and is not flagged for either. The tolerance, as a run's range can be
narrow (0.098-0.101 ms): in that session 28 of the 31 runs' medians lay within 0.099-0.112 ms,
in another 7 of 16 within 0.121-0.166.

A run that saw both speeds is still set against its typical one: its estimates bring its steps
to the median reference (analysis/phase), so rounds whose median differs from the run's by more
than SPEED_RATIO count as moved too, inside the range or not. In one benchmark of all eleven
workloads the ratio was 0.97-1.03 on nine, and 0.64 and 0.67 on the two whose runs had spent
most of their steps slow (references 0.105-0.183 ms, median 0.166): the Hugging Face Trainer's
DataLoader estimate there was 14.8 % against -5.0 % measured, at the other speed.

The reference runs on one thread, so it misses another job taking part of the cores, which
slows the work that uses them all (intra-op threads, DataLoader workers) more than the rest. So
each round also records the CPUs other processes kept busy while it ran (capture/loadprobe), and
`load_differs` is set where their median over all rounds and the run's are apart as `compare`
counts two runs differently loaded (runmeta.other_load_differs). In one benchmark a run of
try_mlp saw 0.56 CPUs of 2 busy elsewhere and its rounds none, the reference 0.81x: not moved,
but the optimizer probe had timed fused Adam's two-thread kernel under that load, at 0.72x the
single-tensor loop against 0.48-0.61x on the quiet machine, and the estimate, 8.6 %, fell short
of the +13.0 % the rounds measured.

Nor does the reference see the host's other guests: a vCPU the hypervisor holds (steal) stops
whatever runs on it, in stretches the reference between steps mostly misses. A run of
try_fakedata with 28 % of its CPU time stolen took 146 ms a step where `try`'s rounds of it,
minutes later, took 73, the reference 1.01x. So each round records its steal too
(Load.steal_share), and `steal_differs` is set where the rounds' median and the run's are
apart by more than runmeta.STEAL_SHARE.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trainprof.runmeta import other_load_differs, steal_differs

RANGE = (10.0, 90.0)  # percentiles of the run's references: the speeds it saw most of the time
TOLERANCE = 1.2  # how far outside that range (as a ratio) the rounds' median counts as moved
# Rounds' median over the run's (or its inverse) from which they count as moved: this VM's two
# speeds are 1.6x apart, and a run that saw both evenly has its median 1.27x from either.
SPEED_RATIO = 1.35


def compare(
    run_s: Sequence[float],
    rounds_s: Sequence[float],
    run_other: float | None = None,
    rounds_other: Sequence[float] = (),
    cpus: int = 1,
    run_steal: float | None = None,
    rounds_steal: Sequence[float] = (),
) -> dict | None:
    """try.json's `machine`: the reference in the run and in the baseline's rounds (ms), their
    ratio (rounds over run: above 1, the machine ran slower during the rounds) and `moved`
    (the rounds' median outside the run's RANGE by more than TOLERANCE, or that ratio beyond
    SPEED_RATIO either way), None where either timed none (a GPU run, older metadata); and
    the CPUs other processes kept busy during the run and (median) during the rounds, with
    `load_differs`, where both are known; likewise the hypervisor's steal (Load.steal_share)
    with `steal_differs`. None where no part is."""
    out: dict = {}
    if len(run_s) and len(rounds_s):
        run = np.asarray(run_s, dtype=float) * 1000
        rounds = np.asarray(rounds_s, dtype=float) * 1000
        lo, hi = np.percentile(run, RANGE)
        mid, here = float(np.median(run)), float(np.median(rounds))
        ratio = here / mid if mid > 0 else None
        outside = here * TOLERANCE < lo or here > hi * TOLERANCE
        off_typical = ratio is not None and not 1 / SPEED_RATIO <= ratio <= SPEED_RATIO
        out.update(
            run_ref_ms=round(mid, 4),
            run_ref_range_ms=[round(float(lo), 4), round(float(hi), 4)],
            rounds_ref_ms=round(here, 4),
            ratio=round(ratio, 3) if ratio is not None else None,
            moved=bool(outside or off_typical),
        )
    if run_other is not None and len(rounds_other):
        here_other = float(np.median(rounds_other))
        out.update(
            run_other_cpus=round(run_other, 3),
            rounds_other_cpus=round(here_other, 3),
            cpus=cpus,
            load_differs=other_load_differs(run_other, here_other, cpus),
        )
    if run_steal is not None and len(rounds_steal):
        here_steal = float(np.median(rounds_steal))
        out.update(
            run_steal_share=round(run_steal, 4),
            rounds_steal_share=round(here_steal, 4),
            steal_differs=steal_differs(run_steal, here_steal),
        )
    return out or None
