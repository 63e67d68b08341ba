"""trainprof: profile a PyTorch training loop and rank its bottlenecks by GPU time lost.

From Python: `trainprof.profile()` (a with-block), `trainprof.diagnose(path)`,
`trainprof.compare(a, b)`; in Jupyter, `%load_ext trainprof` then `%%trainprof`. Importing
trainprof stays cheap: these are loaded on first use (no torch until a block is profiled).
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["profile", "diagnose", "compare", "Profile", "load_ipython_extension"]

if TYPE_CHECKING:
    from trainprof.api import Profile, compare, diagnose, profile
    from trainprof.magic import load_ipython_extension

_LAZY = {
    "profile": "trainprof.api",
    "diagnose": "trainprof.api",
    "compare": "trainprof.api",
    "Profile": "trainprof.api",
    "load_ipython_extension": "trainprof.magic",
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'trainprof' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(where), name)


class _Package(types.ModuleType):
    """`trainprof.diagnose` and `trainprof.compare` are the API's functions, although modules
    of those names exist (the CLI's commands): importing them must not put the module in the
    function's place. The modules stay importable (`from trainprof.diagnose import ...`) and in
    sys.modules."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("diagnose", "compare") and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
