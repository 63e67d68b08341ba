"""Reversible monkey-patching: every replaced attribute is put back, in reverse order; and
patching a module right after the script imports it (AfterImport); editing the arguments a class is
built with (edit_init)."""

from __future__ import annotations

import functools
import importlib.abc
import inspect
import sys
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

_MISSING = object()


class Patches:
    """A stack of undo actions. Several wrappers may stack on one attribute; undo is LIFO."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        """Replace `owner.name` (a class or module attribute) by `value` until restore()."""
        own = vars(owner).get(name, _MISSING)  # inherited attributes are deleted, not re-set

        def undo() -> None:
            if own is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, own)

        setattr(owner, name, value)
        self._undo.append(undo)

    def wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> Any:
        """Replace `owner.name` by `make(original)`; return the original."""
        original = getattr(owner, name)
        self.set(owner, name, make(original))
        return original

    def on_restore(self, undo: Callable[[], None]) -> None:
        """Run `undo` at restore() (removing hooks, import finders...)."""
        self._undo.append(undo)

    def after_import(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        """`patch(module)` now if module `name` is imported, else once it is (AfterImport, its
        finder removed at restore())."""
        if name in sys.modules:
            patch(sys.modules[name])
            return
        finder = AfterImport(name, patch)
        sys.meta_path.insert(0, finder)
        self.on_restore(lambda: finder in sys.meta_path and sys.meta_path.remove(finder))

    def restore(self) -> None:
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:  # restoring the rest matters more than one failure
                pass


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls `callback(module)` once `name` has been imported (its top-level code has run)."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.callback = callback
        self.searching = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        # While this one asks the other finders, another AfterImport of the same module (two
        # Patches sets, as in a `try` round) asks them too, this one included: not twice.
        if fullname != self.name or self.searching:
            return None
        self.searching = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self.searching = False
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module
        callback = self.callback

        def exec_then_patch(module: ModuleType) -> None:
            exec_module(module)
            callback(module)

        loader.exec_module = exec_then_patch  # type: ignore[method-assign]  # this spec's loader only
        return spec


def edit_init(patches: Patches, cls: type, change: Callable[[dict], None]) -> None:
    """Patch `cls.__init__` so that `change` edits its bound arguments (by name, however the
    script passed them) before the original runs."""
    sig = inspect.signature(cls.__init__)

    def make(orig: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(orig)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                bound = sig.bind(self, *args, **kwargs)
            except TypeError:  # let the class raise its own error
                return orig(self, *args, **kwargs)
            change(bound.arguments)
            return orig(*bound.args, **bound.kwargs)

        return __init__

    patches.wrap(cls, "__init__", make)
