"""The cpu-bf16 / no-amp fix on one module: bf16 autocast around its forward, channels-last
weights and 4-D float inputs for a CNN on a CPU where that layout pays, fp32 outputs.

Shared by `trainprof try --fix cpu-bf16` (tryfix/apply.py, on the script's model) and by the
estimate's model probe (capture/modelprobe.py, on a copy of it), so that what the estimate times
is exactly what `try` measures.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch


def to_fp32(x: Any) -> Any:
    """bf16 tensors in a model's output (tensors, tuples, lists, dicts) back to fp32."""
    if isinstance(x, torch.Tensor):
        return x.float() if x.dtype == torch.bfloat16 else x
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(to_fp32(v) for v in x)
    if isinstance(x, list):
        return [to_fp32(v) for v in x]
    if isinstance(x, dict) and type(x) is dict:
        return {k: to_fp32(v) for k, v in x.items()}
    return x  # other containers (HF ModelOutput, named tuples) as they are


def _channels_last(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point():
        return x.contiguous(memory_format=torch.channels_last)
    return x


def is_cnn(module: torch.nn.Module) -> bool:
    """The module holds Conv2d layers: the fix can make it channels-last on a CPU."""
    return any(isinstance(m, torch.nn.Conv2d) for m in module.modules())


def channels_last_now(module: torch.nn.Module) -> bool:
    """Whether the module's 4-D parameters are all channels-last already (the script's own)."""
    four = [p for p in module.parameters() if p.dim() == 4]
    return bool(four) and all(
        p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
        for p in four
    )


def install_autocast(
    module: torch.nn.Module,
    device: str,
    enabled: Callable[[], bool] | None = None,
    channels_last: bool = True,
) -> bool:
    """Make `module`'s forward run under bf16 autocast on `device` (an instance attribute: only
    this module), its outputs back in fp32. On a CPU, a module with Conv2d layers also gets its
    parameters converted to channels-last in place (the optimizer keeps the same tensors) and
    its 4-D float inputs converted on each call, the layout oneDNN's bf16 convolutions are
    written for; unless `channels_last` is False (the model probe measured the model's own
    layout faster under bf16: analysis/bf16_layout). `enabled`, where given, is asked at each
    call: False runs the plain forward (`trainprof try` switching the fix off between steps,
    tryfix/switch; the caller restores the layout). Returns whether channels-last was applied."""
    forward = module.forward
    cl = channels_last and device == "cpu" and is_cnn(module)
    if cl:
        try:
            module.to(memory_format=torch.channels_last)
        except (ValueError, RuntimeError):  # lazy parameters not created yet: bf16 alone
            cl = False

    @functools.wraps(forward)
    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        if enabled is not None and not enabled():
            return forward(*args, **kwargs)
        if cl:
            args = tuple(_channels_last(a) for a in args)
            kwargs = {k: _channels_last(v) for k, v in kwargs.items()}
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            out = forward(*args, **kwargs)
        # The loss runs outside this autocast region, in fp32 as autocast would run it (its
        # fp32 list): bf16 logits beside an fp32 class weight make cross_entropy fail.
        return to_fp32(out)

    module.forward = autocast_forward
    return cl
