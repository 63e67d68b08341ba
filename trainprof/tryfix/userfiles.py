"""In a round of `trainprof try`, the files the script writes by itself go to the round's folder.

tryfix/outputs sends torch's and the frameworks' checkpoints and logs there. A script also writes
through Python's own file calls: a log it appends to with `open(path, "a")`, `numpy.save`, a
pandas CSV, `pathlib.Path.write_text`, a `logging.FileHandler`, a JSON saved
atomically (a temporary file in the same folder, then `os.replace`), a clean-up that deletes its
oldest outputs. In the run that is the user's record; a round, stopped after a few steps with a
fix's numerics, would append to it, overwrite it, or delete it. So while a round runs (until
its process exits: tryfix/round leaves these patches on for the script's atexit handlers):
- `open()` (builtins and io: pathlib, numpy, pandas, logging handlers made in the round go
  through it) and `os.open` with a mode that writes send the path to its mirror below the
  round's folder (outputs.Elsewhere, listed in `redirected`). A mode that keeps what is there
  ("a", "r+", os.open without O_TRUNC) first copies the script's file to the mirror, so that an
  appended log goes on from the run's lines, in the round's copy;
- reading a path the round has written reads the mirror (a script that reads back what it
  saved finds its own), and so do `os.stat`, `chmod`, `utime` and the like of it (`ON_WRITTEN`:
  `os.path.exists`, `getsize`, `shutil.copy2`); a folder's listing does not;
- `os.replace` / `os.rename` onto the script's paths land in the mirror (a file of the run's
  that is renamed is copied there, and stays where it was);
- `os.remove` / `os.unlink` and `shutil.rmtree` remove the round's mirror, never the run's file.
Left as they are: paths in the temp folder outside the working folder (a TemporaryDirectory is the
script's own scratch, and a folder listed after writing to it must show what was written),
libraries' caches (`CACHES`: a compiler's cache that writes a kernel and then checks that it is
there must find it; torch's inductor cache is in the temp folder unless TORCHINDUCTOR_CACHE_DIR says
otherwise), the Python environment's folders, /dev, /proc and /sys, calls given a `dir_fd`, folders
the script makes (`os.makedirs` makes them where it says, empty), writes from C, C++ or Rust code
(h5py; safetensors and save_pretrained are tryfix/outputs'), and from processes the script starts
afresh (spawn, subprocess: a forked DataLoader worker keeps the round's patches).
"""

from __future__ import annotations

import builtins
import functools
import io
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

from trainprof.capture.patching import Patches
from trainprof.tryfix.outputs import Elsewhere

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_SYSTEM = ("/dev", "/proc", "/sys")
# Where libraries keep caches: the variables that move them, and their usual homes.
CACHES = ("XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_HOME",
          "TORCH_EXTENSIONS_DIR", "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE",
          "TRANSFORMERS_CACHE", "CUDA_CACHE_PATH")  # fmt: skip
_CACHE_HOMES = ("~/.cache", "~/.triton", "~/.nv")
# The os calls on a path that see the round's copy where it wrote one.
ON_WRITTEN = ("stat", "lstat", "chmod", "utime", "access", "listxattr", "getxattr", "setxattr")


def left_alone() -> tuple[set[str], set[str]]:
    """The folders whose files a round writes where the script says (see the module's
    docstring): (always: the system's, the caches variables name, the Python environment;
    outside the working folder: the temp folder and the usual cache homes). A working folder
    in the temp folder (a notebook run in /tmp) keeps its files; its neighbours are scratch."""
    always = {*_SYSTEM, *(os.path.abspath(os.environ[v]) for v in CACHES if os.environ.get(v))}
    always |= {os.path.abspath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}}
    temp = tempfile.gettempdir()
    outside = {os.path.abspath(temp), os.path.realpath(temp)}
    outside |= {os.path.abspath(os.path.expanduser(p)) for p in _CACHE_HOMES}
    # Never a folder the working folder is in (a Python installed at /, a cache variable that
    # names a folder above the project), nor the home folder itself.
    cwd = os.path.join(os.getcwd(), "")
    home = os.path.abspath(os.path.expanduser("~"))
    always = {f for f in always if not cwd.startswith(os.path.join(f, "")) and f != home}
    return always, outside - {home}


def _folders(paths: Iterable[str]) -> tuple[str, ...]:
    """Prefixes that match a folder and what is in it (str.startswith takes the tuple)."""
    return tuple(os.path.join(p.rstrip(os.sep), "") for p in paths if p.rstrip(os.sep))


class UserFiles:
    """The round's view of the script's files: which paths go to `where`, and the mirrors the
    round has written (reads of those read the mirror)."""

    def __init__(self, where: Elsewhere, leave: Iterable[str] = ()) -> None:
        """`leave`: more folders of the round's own (its result file's)."""
        self.where = where
        self.real_open = builtins.open  # taken before the patches
        self.real_stat = os.stat
        always, outside = left_alone()
        self.always = _folders(always | {where.root, *map(os.path.abspath, leave)})
        self.outside = _folders(outside)
        self.cwd = os.path.join(os.getcwd(), "")
        self.written = where.made  # the mirrors this round wrote (torch.save's too)

    def user(self, p: Any) -> str | None:
        """`p` as an absolute path where it is one of the script's to keep (else None: a file
        descriptor, the temp folder, a cache, the round's own folder, /dev ...)."""
        if isinstance(p, bytes):
            p = os.fsdecode(p)
        if not isinstance(p, (str, os.PathLike)):
            return None
        full = os.path.abspath(os.fspath(p))
        f = full + os.sep
        if f.startswith(self.always) or (f.startswith(self.outside) and not f.startswith(self.cwd)):
            return None
        return full

    def for_write(self, full: str, keep: bool) -> str:
        """The mirror to write `full` to; `keep`: with the script's file's content first."""
        there = self.where.file(full)
        if keep and not os.path.lexists(there) and self.is_file(full):
            with self.real_open(full, "rb") as src, self.real_open(there, "wb") as dst:
                shutil.copyfileobj(src, dst)
        return there

    def is_file(self, full: str) -> bool:
        """Whether the script's own `full` (not the round's copy) is a file."""
        try:
            return stat.S_ISREG(self.real_stat(full).st_mode)
        except (OSError, ValueError):
            return False

    def for_read(self, full: str) -> str:
        """`full`, or its mirror where the round wrote one."""
        if self.written:
            there = self.where.mirror(full)
            if there in self.written:
                return there
        return full


def keep_user_files(patches: Patches, where: Elsewhere, leave: Iterable[str] = ()) -> UserFiles:
    """Patch Python's file calls for the round (see the module's docstring); `leave`: folders
    of the round's own besides `where.root`."""
    files = UserFiles(where, leave)

    def opener(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            # A read before the round wrote anything (a dataset's files) passes straight on.
            writes = isinstance(mode, str) and any(c in mode for c in "wax+")
            if writes or (files.written and isinstance(mode, str)):
                full = files.user(file)
                if full is not None:
                    file = (files.for_write(full, keep="w" not in mode and "x" not in mode)
                            if writes else files.for_read(full))
            return orig(file, mode, *args, **kwargs)

        return open_

    patches.wrap(builtins, "open", opener)
    patches.set(io, "open", builtins.open)  # the same function (pathlib calls io.open)

    def os_open(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> Any:
            writes = bool(flags & _WRITE_FLAGS)
            if (writes or files.written) and kwargs.get("dir_fd") is None:
                full = files.user(path)
                if full is not None:
                    path = (files.for_write(full, keep=not flags & os.O_TRUNC)
                            if writes else files.for_read(full))
            return orig(path, flags, *args, **kwargs)

        return open_

    def move(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def move_(src: Any, dst: Any, **kwargs: Any) -> Any:
            if kwargs:
                return orig(src, dst, **kwargs)
            came = files.user(src)
            mine = None if came is None else files.for_read(came)
            to = files.user(dst)
            there = dst if to is None else where.file(to)  # to the temp folder, say: as it is
            if came is not None and mine == came:
                # One of the run's files or folders: copied, the original left where it is.
                if os.path.isdir(came):
                    shutil.copytree(came, there, dirs_exist_ok=True)
                else:
                    shutil.copyfile(came, there)
            else:
                orig(src if mine is None else mine, there)
                files.written.discard(mine)
            if to is not None:
                files.written.add(there)
            return None

        return move_

    def remove(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def remove_(path: Any, **kwargs: Any) -> Any:
            full = None if kwargs else files.user(path)
            if full is None:
                return orig(path, **kwargs)
            mine = files.for_read(full)
            if mine != full:
                files.written.discard(mine)
                return orig(mine)
            if not os.path.lexists(full):
                return orig(full)  # FileNotFoundError, as in the run
            return None  # the run's file stays

        return remove_

    def rmtree(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def rmtree_(path: Any, *args: Any, **kwargs: Any) -> Any:
            full = files.user(path)
            if full is None:
                return orig(path, *args, **kwargs)
            there = where.mirror(full)
            for w in list(files.written):  # a copy: another thread may write meanwhile
                if w.startswith(there + os.sep):
                    files.written.discard(w)
            orig(there, ignore_errors=True)
            return None  # the run's folder stays

        return rmtree_

    def on_written(orig: Callable[..., Any]) -> Callable[..., Any]:
        """A call on a path that reads the round's copy where it wrote one."""

        @functools.wraps(orig)
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            if files.written and kwargs.get("dir_fd") is None:
                full = files.user(path)
                if full is not None:
                    path = files.for_read(full)
            return orig(path, *args, **kwargs)

        return call

    patches.wrap(os, "open", os_open)
    # os.path.exists, isfile, getsize; shutil.copy's and copy2's mode, times and attributes
    for name in ON_WRITTEN:
        if hasattr(os, name):
            patches.wrap(os, name, on_written)
    for name in ("replace", "rename"):
        patches.wrap(os, name, move)
    for name in ("remove", "unlink"):
        patches.wrap(os, name, remove)
    patches.wrap(shutil, "rmtree", rmtree)
    return files
