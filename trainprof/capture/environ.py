"""Environment variables set for a while, then put back as they were."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


def restore_env(saved: Mapping[str, str | None]) -> None:
    """Each variable back to its saved value (None: it was not set, and is removed)."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@contextlib.contextmanager
def env_set(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in the environment for the block, the previous ones back after it."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        restore_env(saved)
