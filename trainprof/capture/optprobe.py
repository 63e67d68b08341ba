"""The user's own optimizer, single-tensor loop vs what `trainprof try --fix optimizer-foreach`
applies (fused=True where the class and the parameters support it, else foreach=True): one
step() of each timed after the script ends, for optimizer-foreach's CPU estimate.

Fixed per-class ratios (fused Adam at 0.25x the loop, measured on 4-6 tensor models) missed the
measured saving on half the workloads: what fused=True saves depends on how many tensors there
are and how large (a per-tensor loop of Python and dispatcher calls against one kernel whose own
cost grows with the elements), so it is measured on the run's own parameters.

The user's objects are never changed, nor kept: when an optimizer steps, its class, param
groups' hyper-parameters and parameters' shapes and dtypes are noted (OptimizerSpec); after the
script two new optimizers of that class are built on new parameters of those shapes with random
gradients; the script's optimizer state is not read. Each takes one step first (its state
is created there), then step() of each is timed, interleaved, the least of up to MAX_REPS runs,
in CPU time of this thread (a shared machine's preemptions are not counted), within BUDGET_S.
Each step() follows a backward, untimed, that writes every gradient of its copies, as the loop's
backward does before its step(): steps timed back to back run with their code and data hot, and
time the loop's per-call overhead (torch's step wrapper, the dispatcher) at its least, where the
loop pays more and fused=True as much. `try_mlp`'s Adam (4 tensors) took 0.118 vs 0.057 ms
back to back (0.48x) and 0.162 vs 0.093 ms in its training loop (0.57x, about the same 0.06 ms
saved); after a backward over the copies, 0.142 vs 0.078 ms (0.55x). The ratio is what the
estimate takes, so the 0.48x had overstated the saving by a fifth.
With the run's intra-op thread count (torch.get_num_threads() as the script left it): the update
ran with those threads in the script. The single-tensor loop's ops on small tensors stay on this
thread; a fused kernel splits its tensors among the threads, and this thread's CPU time counts
its own part and its busy waiting for the others (OpenMP spins before it sleeps), so with
several threads and large tensors the fused time can be understated. Skipped, with the reason,
when the parameters are not all on the CPU, exceed MAX_PARAM_BYTES, or a copy cannot be built
or stepped.

The copies keep each parameter's layout: torch's fused CPU kernels are several times slower on
channels-last parameters (dense, but not in the default order) than on contiguous ones. A
ResNet-18's SGD with momentum, one step on this 2-core Zen 5: fused 2.15 ms on contiguous
weights, 6.9-10.8 ms on channels-last ones, where the loop took 3.4-3.7 ms on either; Adam 3.5
against 11.8 ms, AdamW 5.4 against 9.6, Adagrad 3.7 against 8.2. Where the parameters hold 4-D
ones in the default layout (a CNN's convolution weights), the fix is also timed on copies with
those channels-last (`fix_channels_last_ms`): what it takes once `cpu-bf16`'s fix has made the
model channels-last. examples/metrics_sync.py's ResNet: bf16 autocast with channels-last saved
+20.4 to +22.2 % of the step, with fused SGD besides +15.3 %.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainprof.capture.cputime import best_interleaved, cpu_time
from trainprof.errors import one_line
from trainprof.runmeta import OptimizerProbe

MAX_PARAM_BYTES = 256 << 20  # parameters: copies of them, their gradients and two states
BUDGET_S = 0.5  # wall time from the warm-ups on after which no more timed steps are started
MAX_REPS = 20


def fused_ok(params: Any) -> bool:
    """The tensors (a list of tensors or of param-group dicts) are all floating point on a
    device with fused optimizer kernels: fused=True fails at the first step, not at
    construction, on params it does not support."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    if not params:
        return False
    tensors = []
    for p in params:
        if isinstance(p, dict):
            if not isinstance(p["params"], torch.Tensor):
                p["params"] = list(p["params"])  # a generator would be used up here
            group = p["params"]
            tensors += [group] if isinstance(group, torch.Tensor) else group
        else:
            tensors.append(p)
    devices = set(_get_fused_kernels_supported_devices())
    return all(
        isinstance(t, torch.Tensor) and t.is_floating_point() and t.device.type in devices
        for t in tensors
    )


def single_tensor(opt: Any) -> bool:
    """The optimizer ran torch's single-tensor loop: neither foreach nor fused asked for, on CPU
    parameters (torch picks foreach by default only when every parameter is on CUDA)."""
    groups = getattr(opt, "param_groups", None) or []
    if not groups or "foreach" not in inspect.signature(type(opt).__init__).parameters:
        return False
    for g in groups:
        if g.get("foreach") or g.get("fused"):
            return False
        if any(p.device.type != "cpu" for p in g["params"]):
            return False
    return True


@dataclass(frozen=True)
class OptimizerSpec:
    """What the probe needs of a script's optimizer, taken when it steps: its class, each param
    group's hyper-parameters and its parameters' shapes and dtypes. Not the optimizer itself: a
    reference would keep it alive, and the step finder takes the next optimizer as the one that
    marks steps only once the first is gone (a function that builds its own per call)."""

    cls: type
    groups: list[dict]  # hyper-parameters, "params": [(shape, dtype, channels_last)]
    nbytes: int
    looped: bool  # it ran the single-tensor loop (single_tensor)
    fused: bool = False  # it ran fused=True on CPU parameters already


def spec_of(opt: Any) -> OptimizerSpec:
    groups, nbytes = [], 0
    for g in opt.param_groups:
        hyper = {k: v for k, v in g.items() if k not in ("params", "foreach", "fused")}
        groups.append({**hyper, "params": [(tuple(p.shape), p.dtype, channels_last(p))
                                           for p in g["params"]]})
        nbytes += sum(p.numel() * p.element_size() for p in g["params"])
    try:
        looped = single_tensor(opt)
        fused = all(g.get("fused") and all(p.device.type == "cpu" for p in g["params"])
                    for g in opt.param_groups) and bool(opt.param_groups)
    except Exception:  # noqa: BLE001 - an optimizer we cannot read: not probed
        looped = fused = False
    return OptimizerSpec(type(opt), groups, nbytes, looped, fused)


def channels_last(p: torch.Tensor) -> bool:
    """A 4-D tensor laid out channels-last (not also contiguous in the default order)."""
    return (p.dim() == 4 and not p.is_contiguous()
            and p.is_contiguous(memory_format=torch.channels_last))


def _convertible(spec: OptimizerSpec) -> bool:
    """Some parameter is 4-D floating point in the default layout: a convolution's weight, which
    `cpu-bf16`'s fix would make channels-last."""
    return any(len(shape) == 4 and dtype.is_floating_point and not cl
               for g in spec.groups for shape, dtype, cl in g["params"])


def _copy_groups(spec: OptimizerSpec, all_cl: bool = False) -> tuple[list[dict], int, int]:
    """Param-group dicts on new parameters of the spec's shapes, dtypes and layouts, with
    gradients (random values: the update's cost does not depend on them), the tensors and the
    elements. `all_cl`: every 4-D parameter channels-last."""
    groups, tensors, elements = [], 0, 0
    for g in spec.groups:
        params = []
        for shape, dtype, cl in g["params"]:
            c = torch.randn(shape, dtype=dtype)
            if len(shape) == 4 and (cl or all_cl):
                c = c.contiguous(memory_format=torch.channels_last)
            c.requires_grad_(True)
            c.grad = torch.randn_like(c)
            params.append(c)
            tensors += 1
            elements += c.numel()
        groups.append({**g, "params": params})
    return groups, tensors, elements


def _build(cls: type, groups: list[dict], **flags: bool) -> Any:
    return cls([{**g, **flags} for g in groups], **flags)


def _backward_over(groups: list[dict]) -> Callable[[], None]:
    """A backward that adds to every gradient of the groups' parameters (values irrelevant to
    the update's cost), as the training loop's backward writes them before its step()."""
    params = [p for g in groups for p in g["params"]]

    def backward() -> None:
        with torch.enable_grad():
            torch.autograd.backward([p.real.sum() for p in params])  # real: complex params too

    return backward


def _too_large(spec: OptimizerSpec) -> str:
    """Why the parameters are not copied (empty: they are)."""
    if spec.nbytes > MAX_PARAM_BYTES:
        return f"the parameters are too large to copy ({spec.nbytes >> 20} MiB)"
    return ""


def _step_pair(
    a: Any, a_groups: list[dict], b: Any, b_groups: list[dict]
) -> tuple[float, float, int]:
    """step() of optimizers `a` and `b` on their own copies (s of CPU time, the least of each),
    each after a backward over its copies, a warm-up step each (the state is created there, its
    time counted too), then interleaved within BUDGET_S; and the interleaved runs of each."""
    before_a, before_b = _backward_over(a_groups), _backward_over(b_groups)
    started = time.perf_counter()
    with torch.no_grad():
        before_a()
        first_a = cpu_time(a.step)
        before_b()
        first_b = cpu_time(b.step)
        best_a, best_b, reps = best_interleaved(a.step, b.step, MAX_REPS, BUDGET_S, started,
                                                before_a=before_a, before_b=before_b)
    return min(best_a, first_a), min(best_b, first_b), reps


def time_optimizer(opt: Any) -> OptimizerProbe:
    """step() of copies of `opt` (an optimizer or its OptimizerSpec): the single-tensor loop vs
    fused=True (or foreach=True)."""
    spec = opt if isinstance(opt, OptimizerSpec) else spec_of(opt)
    cls = spec.cls
    threads = torch.get_num_threads()
    info = OptimizerProbe(threads=threads, skipped=_too_large(spec))
    if info.skipped:
        return info
    try:
        groups, info.tensors, info.elements = _copy_groups(spec)
        takes = inspect.signature(cls.__init__).parameters
        loop = _build(cls, groups, foreach=False, **({"fused": False} if "fused" in takes else {}))
        fix_groups = _copy_groups(spec)[0]  # its own copies: the two must not share tensors
        fix = None
        if "fused" in takes and fused_ok(fix_groups):
            try:
                fix, info.fix = _build(cls, fix_groups, foreach=False, fused=True), "fused"
            except (RuntimeError, ValueError, TypeError):
                pass  # as `try` does: a device or dtype fused does not support, foreach then
        if fix is None:
            fix, info.fix = _build(cls, fix_groups, foreach=True), "foreach"
        best_loop, best_fix, reps = _step_pair(loop, groups, fix, fix_groups)
    except Exception as err:  # noqa: BLE001 - any failure means the fixed ratios instead
        info.skipped = f"the copy or its step failed: {one_line(err)}"
        return info
    info.loop_ms, info.fix_ms, info.reps = round(best_loop * 1e3, 4), round(best_fix * 1e3, 4), reps
    # the copies above freed before the next two are made: at most two sets of copies at once
    del loop, fix, groups, fix_groups
    if info.fix == "fused" and _convertible(spec):
        got = _fused_layouts(spec)
        if got is not None and got[0] > 0:  # scaled to the main pass's fused time
            info.fix_channels_last_ms = round(got[1] / got[0] * best_fix * 1e3, 4)
    return info


def time_fused_layouts(spec: OptimizerSpec) -> OptimizerProbe:
    """An optimizer that ran fused=True already: its step() on copies as the script's and on
    copies with the 4-D parameters channels-last (`fix_ms`, `fix_channels_last_ms`; no loop):
    what `cpu-bf16`'s fix, which makes a CNN's weights channels-last, adds to its step."""
    info = OptimizerProbe(threads=torch.get_num_threads(), fix="fused", skipped=_too_large(spec))
    if info.skipped:
        return info
    info.tensors = sum(len(g["params"]) for g in spec.groups)
    info.elements = sum(math.prod(shape) for g in spec.groups for shape, _, _ in g["params"])
    got = _fused_layouts(spec)
    if got is None:
        info.skipped = "the copy or its step failed"
        return info
    info.fix_ms, info.fix_channels_last_ms = round(got[0] * 1e3, 4), round(got[1] * 1e3, 4)
    info.reps = got[2]
    return info


def _fused_layouts(spec: OptimizerSpec) -> tuple[float, float, int] | None:
    """fused=True's step() (s of CPU time, the least) on copies as the script's and on copies
    whose 4-D parameters are all channels-last, interleaved so that both are read at the same
    moment of the machine, and the runs of each; None where it fails."""
    try:
        plain, cl = _copy_groups(spec)[0], _copy_groups(spec, all_cl=True)[0]
        a = _build(spec.cls, plain, foreach=False, fused=True)
        b = _build(spec.cls, cl, foreach=False, fused=True)
        return _step_pair(a, plain, b, cl)
    except Exception:  # noqa: BLE001 - the figures without it stand
        return None


def probe(optimizers: dict[str, Any], cuda_used: bool) -> dict[str, OptimizerProbe]:
    """Per class (as `optimizer_times_s` names them), the timed steps of the optimizer that ran
    the single-tensor loop last (time_optimizer), or fused=True already with 4-D parameters in
    the default layout (time_fused_layouts); other classes are left out. Nothing on a CUDA
    run."""
    if cuda_used:
        return {}
    out: dict[str, OptimizerProbe] = {}
    for name, opt in optimizers.items():
        spec = opt if isinstance(opt, OptimizerSpec) else spec_of(opt)
        if spec.looped:
            out[name] = time_optimizer(spec)
        elif spec.fused and _convertible(spec):
            out[name] = time_fused_layouts(spec)
    return out
