"""Reversible monkey-patching: every replaced attribute is put back, in reverse order."""

from __future__ import annotations

from collections.abc import Callable
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

    def restore(self) -> None:
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:  # restoring the rest matters more than one failure
                pass
