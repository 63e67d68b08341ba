"""torch API differences across the versions trainprof supports (torch >= 2.2)."""

from __future__ import annotations

try:  # torch >= 2.3
    from torch.compiler import is_compiling
except ImportError:  # pragma: no cover - torch 2.2
    from torch._dynamo import is_compiling

__all__ = ["is_compiling"]
