"""Step timing shared by the examples (each is run as a script, so this folder is on
sys.path, under `python` and under `trainprof run` alike)."""

import time

import torch


class StepClock:
    """Wall-clock step timing that adds no device syncs (a profiler would flag them).

    A step runs from asking the loader for a batch to asking for the next one. The first two
    steps (worker start-up, allocator warm-up) are left out when there are enough steps.
    """

    def __init__(self, device: torch.device, steps: int) -> None:
        self.device, self.warmup = device, 2 if steps > 4 else 0
        self.starts: list[float] = []  # when each step asked for its batch
        self.waits: list[float] = []  # how long it then waited for the batch

    def timed(self, loader):
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self.starts.append(t0)
            self.waits.append(time.perf_counter() - t0)
            yield batch

    def summary(self, name: str, fixed: bool) -> str:
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # once, at the end: let queued GPU work finish before timing
        ends = [*self.starts[1:], time.perf_counter()]
        durations = [end - start for start, end in zip(self.starts, ends, strict=True)]
        w = self.warmup if len(durations) > self.warmup else 0
        step_ms = sorted(1000 * d for d in durations[w:])
        total_ms = sum(step_ms) or 1.0
        return (
            f"{name} [{'fixed' if fixed else 'broken'}] on {self.device.type}: "
            f"{len(self.starts)} steps, mean step {total_ms / max(len(step_ms), 1):.1f} ms, "
            f"median {step_ms[len(step_ms) // 2] if step_ms else 0.0:.1f} ms "
            f"(data wait {100_000 * sum(self.waits[w:]) / total_ms:.0f}%, first {w} steps untimed)"
        )
