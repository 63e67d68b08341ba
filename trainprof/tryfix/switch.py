"""A fix switched on and off in blocks of steps inside one round's process: both sides of the
comparison under the same machine.

A 2-core VM's speed moves in stretches of seconds: one baseline round of try_fakedata ran 38 ms
steps for a second, then 66-72 ms for two, in one process with nothing changed. Rounds of
separate processes, each a few seconds long, then each land in one stretch or another, and the
fix's saving is buried: cpu-bf16 measured +30.8 % [+6.9, +51.2] on try_fakedata against an
estimate of 10.3 %, and fused SGD -43 % on quickstart, whose whole update is 1 % of its step.
The same two sides alternated in blocks of 8 steps in one process measured 9.6 % and 12.6 % for
cpu-bf16 (the fetch unchanged, forward + backward 1.6-1.7x as fast).

So the fixes that can be turned on and off between two steps (a flag read at each call: the
bf16 autocast of the model's forward with its channels-last weights, zero_grad's set_to_none,
the optimizer's foreach/fused flags) are measured that way by default: after the warm-up, the
round's steps run in blocks, each block one transition step (not timed: the first step after a
switch pays the new layout's first allocations, grads re-created, a momentum buffer converted)
and `block` timed steps, the fix off and on in the order ABBA (BAAB in every other round), so
that a machine speeding up or slowing down steadily during a round favours neither side. The
switch is flipped at the step boundary, outside the step times (capture/stepper on_step).
"""

from __future__ import annotations

from collections.abc import Callable

# Blocks of a round in the order ABBA: False is the fix off (the baseline), True on.
PATTERN = (False, True, True, False)
TRANSITION = 1  # the first step of each block: not timed


def side(step: int, warmup: int, block: int, parity: int) -> bool:
    """Whether the fix is on in `step` of a round (steps counted from 0): the warm-up runs with
    the first block's side, then blocks of TRANSITION + `block` steps in PATTERN's order,
    reversed when `parity` is odd."""
    j = max(step - warmup, 0) // (TRANSITION + block)
    on = PATTERN[j % len(PATTERN)]
    return on != bool(parity % 2)


def steps_for(kept: int, block: int, warmup: int) -> int:
    """The steps a round runs to time about `kept` steps on each side: whole ABBA cycles."""
    cycles = max(1, -(-2 * kept // (len(PATTERN) * block)))
    return warmup + cycles * len(PATTERN) * (TRANSITION + block)


def clean_pairs(n: int, block: int, warmup: int, skip: set[int]) -> int:
    """How many pairs of blocks `split` keeps from a round of `n` steps whose steps in `skip`
    are not timed (evaluation passes), at `block` timed steps a block."""
    size = TRANSITION + block
    pairs, start = 0, warmup
    while start + 2 * size <= n:
        kept = {k for b in (start, start + size) for k in range(b + TRANSITION, b + size)}
        pairs += not skip & kept
        start += 2 * size
    return pairs


def split(
    times: list[float], on: list[bool], warmup: int, head: int, skip: set[int], block: int
) -> tuple[list[float], list[float]]:
    """A round's timed steps, (the fix off, the fix on), as whole blocks of `block` steps: the
    blocks of the schedule (`side`) without their TRANSITION steps, taken two by two (blocks 0
    and 1, 2 and 3, ...: one of each side, next to each other in time), so that the i-th block
    of one list ran beside the i-th of the other. A pair with a step before `head` (the
    warm-up), in `skip` (an evaluation pass, a recompilation), past the round's end, or not one
    block of each side, is left out whole."""
    sides: tuple[list[float], list[float]] = ([], [])
    n = min(len(times), len(on))
    size = TRANSITION + block
    start = warmup
    while start + 2 * size <= n:
        pair = [range(b + TRANSITION, b + size) for b in (start, start + size)]
        flags = [{on[k] for k in kept} for kept in pair]
        steps = {k for kept in pair for k in kept}
        if min(steps) >= head and not skip & steps and sorted(map(len, flags)) == [1, 1] and (
            flags[0] != flags[1]
        ):
            for kept in sorted(pair, key=lambda r: on[r.start]):  # off first
                sides[int(on[kept.start])].extend(times[k] for k in kept)
        start += 2 * size
    return sides


class Switch:
    """Whether the round's fixes are on. The fixes read `on` at each call, or register a
    callback for what must change when it flips (a module's layout). On by default: a round
    without alternation runs with its fixes on throughout."""

    def __init__(self) -> None:
        self.on = True
        self._changed: list[Callable[[bool], None]] = []

    def when_changed(self, fn: Callable[[bool], None]) -> None:
        self._changed.append(fn)

    def set(self, on: bool) -> None:
        if on == self.on:
            return
        self.on = on
        for fn in self._changed:
            fn(on)


class Alternation:
    """At each step boundary, sets the switch for the next step (`side`), and records the side
    every step ran with (`sides`, the round's result)."""

    def __init__(
        self, switch: Switch, steps_done: Callable[[], int], warmup: int, block: int, parity: int
    ) -> None:
        self.switch = switch
        self.steps_done = steps_done
        self.warmup = warmup
        self.block = block
        self.parity = parity
        self.sides: list[bool] = []
        switch.set(side(0, warmup, block, parity))

    def after_step(self) -> None:
        """Called at every step boundary, outside the step times (capture/stepper on_step)."""
        done = self.steps_done()
        self.sides.extend([self.switch.on] * (done - len(self.sides)))
        self.switch.set(side(done, self.warmup, self.block, self.parity))
