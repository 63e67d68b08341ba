"""Which file:line in *user code* caused something: the first frame that is not a library.

Library = torch, site-packages, the standard library, trainprof itself. Walking `sys._getframe`
with a per-filename cache costs well under a microsecond per frame.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from types import FrameType


def _norm(path: str) -> str:
    return os.path.normcase(os.path.abspath(path))


def _library_roots() -> list[str]:
    roots: set[str] = set()
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(key):
            roots.add(paths[key])
    try:
        roots.update(site.getsitepackages())
    except AttributeError:  # old virtualenv's site module
        pass
    user_site = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    if user_site:
        roots.add(user_site)
    packages = ("site-packages", "dist-packages")
    roots.update(p for p in sys.path if p.rstrip(os.sep).endswith(packages))
    trainprof_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    roots.add(trainprof_dir)
    torch_mod = sys.modules.get("torch")
    if torch_mod is not None and getattr(torch_mod, "__file__", None):
        roots.add(os.path.dirname(torch_mod.__file__))
    return [_norm(r) for r in roots]


class UserCode:
    """Classifies source files as user code or library, longest matching root wins.

    `user_roots` marks the script's own tree as user code even when it lives inside a library
    root (a module run with -m from site-packages); a venv inside the project stays library
    because its root is the longer match.
    """

    def __init__(self, user_roots: list[str] | None = None) -> None:
        self._lib = _library_roots()
        self._user = [_norm(r) for r in (user_roots or [])]
        self._cache: dict[str, bool] = {}

    @staticmethod
    def _longest(path: str, roots: list[str]) -> int:
        best = -1
        for root in roots:
            if (path == root or path.startswith(root.rstrip(os.sep) + os.sep)) and len(root) > best:
                best = len(root)
        return best

    def _classify(self, filename: str) -> bool:
        if filename.startswith("<"):  # <frozen ...>, <string> (dataclass/namedtuple code)
            return False
        path = _norm(filename)
        return self._longest(path, self._user) >= self._longest(path, self._lib)

    def is_user(self, filename: str) -> bool:
        known = self._cache.get(filename)
        if known is None:
            known = self._cache[filename] = self._classify(filename)
        return known

    def location(self, frame: FrameType | None) -> str | None:
        """`file:line` of the first user frame at or above `frame`, None when there is none."""
        cache = self._cache
        while frame is not None:
            filename = frame.f_code.co_filename
            user = cache.get(filename)
            if user is None:
                user = self.is_user(filename)
            if user:
                return f"{filename}:{frame.f_lineno}"
            frame = frame.f_back
        return None

    def caller(self, depth: int = 2) -> str | None:
        """Location of the first user frame above the caller of the function calling this."""
        try:
            return self.location(sys._getframe(depth))
        except ValueError:  # stack shallower than depth
            return None
