"""Peak GPU memory against the device's memory, for `batch-size` and `memory-pressure`.

The peak is the largest `Total Allocated` of the `[memory]` events on a GPU (`Device Id` >= 0),
recorded with `profile_memory=True`: bytes held by PyTorch's caching allocator in live tensors.
The allocator reserves more than that (cached blocks, fragmentation), so the peak is a lower
bound of what the process holds. The device's memory is `totalGlobalMem` of that device in
deviceProperties. 2021-era traces record only `Bytes` deltas, which give no absolute level:
no peak is reported for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainprof.analysis.context import Context

GB = 1e9


@dataclass
class DeviceMemory:
    device: int
    name: str
    peak: int  # bytes
    total: int  # bytes
    peak_ts: float  # µs, when the peak was reached
    samples: int  # memory events on that device

    @property
    def pct(self) -> float:
        return 100.0 * self.peak / self.total


def _totals(ctx: Context) -> dict[int, tuple[int, str]]:
    out = {}
    for p in ctx.trace.meta.device_properties or []:
        if not isinstance(p, dict):
            continue
        dev, mem = p.get("id"), p.get("totalGlobalMem")
        if isinstance(dev, int) and isinstance(mem, int) and mem > 0:
            out[dev] = (mem, str(p.get("name", "?")))
    return out


def device_memory(ctx: Context) -> DeviceMemory | None:
    """The GPU closest to full (by peak share of its memory), or None when unknown."""
    mem = ctx.trace.memory
    totals = _totals(ctx)
    best: DeviceMemory | None = None
    for dev in np.unique(mem.device[mem.device >= 0]).tolist():
        m = (mem.device == dev) & (mem.total_allocated > 0)
        if not m.any() or dev not in totals:
            continue
        k = int(np.argmax(np.where(m, mem.total_allocated, -1)))
        total, name = totals[dev]
        got = DeviceMemory(
            dev, name, int(mem.total_allocated[k]), total, float(mem.ts[k]), int(m.sum())
        )
        if best is None or got.pct > best.pct:
            best = got
    return best


def gb(n: float) -> str:
    return f"{n / GB:.2f} GB" if n >= GB else f"{n / 1e6:.0f} MB"
