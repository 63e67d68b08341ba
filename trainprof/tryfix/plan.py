"""How long `trainprof try`'s rounds run and in what blocks, from what the run recorded: the
steps a round keeps, the switched rounds' blocks, and where the script ends by itself."""

from __future__ import annotations

import math

from trainprof.runmeta import RunMeta
from trainprof.stats import BLOCK_STEPS
from trainprof.tryfix import switch

WARMUP_STEPS = 5  # allocator warm-up, the first batches, DataLoader worker start-up
# Kept steps per round at most. A round of a fast step is mostly the script's start-up, and few
# steps of it are noise: try_mlp (0.4 ms steps), rounds of 25 kept steps measured fused Adam at
# +4.1 % [-22.2, +23.9], of 295 at +13.7 % [+11.8, +15.6].
MAX_KEPT_STEPS = 1000
MIN_KEPT_STEPS = 36  # three blocks (tryfix/measure): one a stall fell into is outvoted
# A switched round's blocks last about this long (at most BLOCK_STEPS steps, at least
# MIN_SWITCH_BLOCK): a VM's speed moves in stretches of seconds, and the shorter the blocks,
# the more of them share one stretch; each costs a transition step, not timed.
SWITCH_BLOCK_S = 0.25
MIN_SWITCH_BLOCK = 4
SWITCH_PAIRS = 2  # pairs of blocks a switched round keeps at least, where the script allows


def run_step(meta: RunMeta) -> float:
    """The run's median step in s, without its evaluation passes and thread steps (0.1 when it
    timed none)."""
    aside = meta.altered_steps()  # evaluation passes, steps run with fewer threads
    plain = [t for i, t in enumerate(meta.step_times_s) if i >= 1 and i not in aside]
    times = sorted(plain or meta.step_times_s)
    return times[len(times) // 2] if times else 0.1


def default_steps(meta: RunMeta) -> int:
    """Enough steps for a stable pace: at least MIN_KEPT_STEPS kept steps, and about 3 s of them
    (at most MAX_KEPT_STEPS)."""
    kept = min(MAX_KEPT_STEPS, max(MIN_KEPT_STEPS, math.ceil(3.0 / max(run_step(meta), 1e-4))))
    return WARMUP_STEPS + kept


def switch_block(meta: RunMeta) -> int:
    """Timed steps per block of a switched round: about SWITCH_BLOCK_S of the run's step."""
    steps = round(SWITCH_BLOCK_S / max(run_step(meta), 1e-4))
    return min(BLOCK_STEPS, max(MIN_SWITCH_BLOCK, steps))


def script_end(meta: RunMeta) -> int | None:
    """The steps the script runs before it ends by itself, as the run saw it; None where the run
    does not say (it failed, or `--max-steps` ended it: a round runs the script further)."""
    n = len(meta.step_times_s)
    stopped = (meta.max_steps and n >= meta.max_steps) or any(
        x.startswith("stopped by --max-steps") for x in meta.notes)  # older metadata
    return n if n and meta.status == "ok" and not stopped else None


def fit_block(meta: RunMeta, block: int, steps: int) -> int:
    """`block`, or where the script ends before SWITCH_PAIRS pairs of blocks clear of its
    evaluation passes (the run's `eval_steps`; `split` leaves out a pair holding one), the block
    from MIN_SWITCH_BLOCK up that keeps the most steps timed. Lightning's example ends at 60
    steps and validates at steps 20 and 40: both pairs of blocks of 12 held one, and `try` timed
    nothing switched; blocks of 4 keep five pairs."""
    n, evals = script_end(meta), set(meta.eval_steps)
    if not n or not evals:
        return block

    def timed(b: int) -> int:
        end = min(n, switch.steps_for(steps - WARMUP_STEPS, b, WARMUP_STEPS))
        return switch.clean_pairs(end, b, WARMUP_STEPS, evals) * b

    if timed(block) >= SWITCH_PAIRS * block:
        return block
    best = max(range(MIN_SWITCH_BLOCK, block + 1), key=lambda b: (timed(b), b))
    return best if timed(best) > 0 else block
