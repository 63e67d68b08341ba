"""In a round of `trainprof try`, what the script records does not land where the run's did.

A round runs the script again. What the run wrote is the user's record: a checkpoint, a trace of
the script's own profiler (capture/userprof lists those, never touches them). A round would write
them again: over the run's Hugging Face checkpoints (`output_dir/checkpoint-500`, with weights of
a few hundred steps and a fix's numerics), over a trace exported to a fixed path, one more trace
per round into a `tensorboard_trace_handler` folder, one more Lightning `version_N` per round.
So in a round:
- the script's own profiler runs as it did in the run (the rounds time the script the run
  timed), but its exports write nothing (`hold_profiler_files`);
- checkpoints and the frameworks' log folders go to the round's own folder, deleted after it
  (`redirect_records`): `torch.save` to a path (and `torch.load` of that path, so that a script
  that reads back what it saved still finds it), the Hugging Face Trainer's `output_dir` (its
  checkpoints, state and logs; `train(resume_from_checkpoint=True)` still resumes from the run's
  last checkpoint, read, not written) and `save_model(dir)`; accelerate's `project_dir` and
  `logging_dir` (with automatic checkpoint naming and a total limit, a round's `save_state()`
  deleted the run's oldest checkpoints; `load_state()` resumes from the run's latest until the
  round saved one), `save_state(dir)`, `save_model`, `save`; Lightning's `default_root_dir` (its
  `lightning_logs`, and checkpoints without a dirpath), `ModelCheckpoint(dirpath)`,
  `Trainer.save_checkpoint(path)`, `TensorBoardLogger` and `CSVLogger`'s `save_dir`; torch's
  TensorBoard `SummaryWriter` (`runs/<time>_<host>` without a `log_dir`: one more run per round);
  safetensors' `save_file` / `save_model` (and their loads of what the round saved), written
  from Rust; transformers' `save_pretrained(dir)` of a model or a tokenizer.
`HeldOutputs` records what started, which files were not written and which paths went
elsewhere, for the round's result. What the script writes through Python's own file calls
(`open()`, `numpy.save`, `os.replace`) goes to the same folder by tryfix/userfiles.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from trainprof.capture.patching import Patches, edit_init

_LIGHTNING_PACKAGES = ("pytorch_lightning", "lightning.pytorch")


@dataclass
class HeldOutputs:
    """What the round kept from where the run wrote: `started` names each kind of the script's
    profiler that started (torch.profiler.profile, ...), `unwritten` the files its exports would
    have written, `redirected` the script's paths written to the round's folder instead."""

    started: list[str] = field(default_factory=list)
    unwritten: list[str] = field(default_factory=list)
    redirected: list[str] = field(default_factory=list)

    def result(self) -> dict[str, Any]:
        """The round's result entries (tryfix/command reads them)."""
        return {
            "script_profiler": {"started": self.started, "unwritten": self.unwritten},
            "redirected": self.redirected,
        }


def hold_profiler_files(patches: Patches) -> HeldOutputs:
    """Patch torch's profilers (and Lightning's, once imported) so that nothing they export is
    written; the profiling itself is left as it is."""
    from torch.autograd import profiler as legacy
    from torch.profiler import profiler as kineto

    held = HeldOutputs()
    starts = (
        (kineto._KinetoProfile, "start", "torch.profiler.profile"),
        (kineto.profile, "start", "torch.profiler.profile"),  # its own, not always the base's
        (legacy.profile, "__enter__", "torch.autograd.profiler.profile"),
    )
    for owner, start, kind in starts:
        if start in vars(owner):
            patches.wrap(owner, start, lambda orig, kind=kind: _noting(orig, held, kind))
    for owner in (kineto._KinetoProfile, legacy.profile):
        for name in ("export_chrome_trace", "export_stacks", "export_memory_timeline"):
            if callable(vars(owner).get(name)):
                patches.wrap(owner, name, lambda orig: _unwritten(orig, held))

    def lightning(module: ModuleType) -> None:
        cls = getattr(module, "Profiler", None)
        if cls is not None and callable(vars(cls).get("_prepare_streams")):
            patches.wrap(cls, "_prepare_streams", lambda orig: _summary_unwritten(orig, held))

    for package in _LIGHTNING_PACKAGES:
        patches.after_import(f"{package}.profilers.profiler", lightning)
    return held


def _noting(orig: Callable[..., Any], held: HeldOutputs, kind: str) -> Callable[..., Any]:
    @functools.wraps(orig)
    def start(prof: Any, *args: Any, **kwargs: Any) -> Any:
        if kind not in held.started and getattr(prof, "enabled", True) is not False:
            held.started.append(kind)
        return orig(prof, *args, **kwargs)

    return start


def _unwritten(orig: Callable[..., Any], held: HeldOutputs) -> Callable[..., Any]:
    @functools.wraps(orig)
    def export(prof: Any, path: Any = None, *args: Any, **kwargs: Any) -> None:
        if isinstance(path, (str, os.PathLike)):
            held.unwritten.append(os.path.abspath(os.fspath(path)))

    return export


def _summary_unwritten(orig: Callable[..., Any], held: HeldOutputs) -> Callable[..., Any]:
    """Lightning's Profiler appends its summary to DIRPATH/FILENAME when both are set (else it
    logs it): the summary goes nowhere instead."""

    @functools.wraps(orig)
    def _prepare_streams(prof: Any) -> None:
        if getattr(prof, "_write_stream", None) is not None:
            return
        dirpath, filename = getattr(prof, "dirpath", None), getattr(prof, "filename", None)
        if not (dirpath and filename):
            return orig(prof)
        named = getattr(prof, "_prepare_filename", None)  # Lightning's name with its stage
        name = named() if callable(named) else str(filename)
        held.unwritten.append(os.path.abspath(os.path.join(str(dirpath), name)))
        prof._write_stream = lambda _text: None

    return _prepare_streams


class Elsewhere:
    """The round's own folder `root`, holding every redirected path at its absolute path below
    it (so that two records never meet); `held.redirected` lists the paths redirected."""

    def __init__(self, root: str, held: HeldOutputs) -> None:
        self.root = os.path.abspath(root)
        self.held = held
        self.originals: dict[str, str] = {}  # redirected path -> the script's
        self.made: set[str] = set()  # the files `file` gave out (tryfix/userfiles reads them)

    def path(self, p: Any) -> str:
        """Where the round writes what the script writes at `p` (a file or a folder)."""
        full = os.path.abspath(os.fspath(p))
        if full == self.root or full.startswith(self.root + os.sep):
            return full  # already there (a checkpoint file inside a redirected output_dir)
        if full not in self.held.redirected:
            self.held.redirected.append(full)
        there = self.mirror(full)
        self.originals[there] = full
        return there

    def existing(self, p: Any) -> str | None:
        """Where the round wrote `p`, if it did (a script reading back its checkpoint)."""
        there = self.mirror(p)
        return there if os.path.exists(there) else None

    def mirror(self, p: Any) -> str:
        """Where `p` is below the round's folder (nothing made, nothing recorded)."""
        full = os.path.abspath(os.fspath(p))
        return os.path.join(self.root, os.path.splitdrive(full)[1].lstrip(os.sep))

    def file(self, p: Any) -> str:
        """`path`, with its parent folder made."""
        there = self.path(p)
        os.makedirs(os.path.dirname(there), exist_ok=True)
        self.made.add(there)
        return there


def redirect_records(patches: Patches, root: str, held: HeldOutputs) -> Elsewhere:
    """Send the script's checkpoints and the frameworks' log folders to `root` (see the module's
    docstring)."""
    import torch

    where = Elsewhere(root, held)

    patches.wrap(torch, "save", lambda orig: _path_arg(orig, "f", where.file, 1))
    patches.wrap(torch, "load", lambda orig: _path_arg(orig, "f", where.existing, 0))

    def folder_arg(*names: str) -> Callable[[dict], None]:
        def change(a: dict) -> None:
            for name in names:
                if a.get(name) is not None:
                    a[name] = where.path(a[name])

        return change

    def hf_arguments(module: ModuleType) -> None:
        cls = getattr(module, "TrainingArguments", None)
        if cls is None or not callable(vars(cls).get("__post_init__")):
            return

        # After the original, which sets the default output_dir and expands ~ (logging_dir:
        # older versions).
        patches.wrap(cls, "__post_init__",
                     lambda orig: _folders_after(orig, where, "output_dir", "logging_dir"))

    def hf_trainer(module: ModuleType) -> None:
        cls = getattr(module, "Trainer", None)
        if cls is None:
            return
        if callable(vars(cls).get("save_model")):
            patches.wrap(cls, "save_model", lambda orig: _path_arg(orig, "output_dir", where.path))
        last = getattr(module, "get_last_checkpoint", None)
        if callable(vars(cls).get("train")) and callable(last):
            patches.wrap(cls, "train", lambda orig: _resumed(orig, where, last))

    def lightning_trainer(module: ModuleType) -> None:
        cls = getattr(module, "Trainer", None)
        if cls is None:
            return

        def change(a: dict) -> None:
            a["default_root_dir"] = where.path(a.get("default_root_dir") or os.getcwd())

        edit_init(patches, cls, change)
        if callable(vars(cls).get("save_checkpoint")):
            patches.wrap(
                cls, "save_checkpoint", lambda orig: _path_arg(orig, "filepath", where.file)
            )

    def lightning_class(name: str, *args: str) -> Callable[[ModuleType], None]:
        def patch(module: ModuleType) -> None:
            cls = getattr(module, name, None)
            if cls is not None:
                edit_init(patches, cls, folder_arg(*args))

        return patch

    def accelerate_project(module: ModuleType) -> None:
        cls = getattr(module, "ProjectConfiguration", None)
        if cls is None:
            return

        for name in ("__post_init__", "set_directories"):
            if callable(vars(cls).get(name)):
                patches.wrap(cls, name,
                             lambda orig: _folders_after(orig, where, "project_dir", "logging_dir"))

    def accelerator(module: ModuleType) -> None:
        cls = getattr(module, "Accelerator", None)
        if cls is None:
            return
        for name, arg, at, to in (
            ("save", "f", 2, where.file),
            ("save_model", "save_directory", 2, where.path),
            ("save_state", "output_dir", 1, where.path),
            ("load_state", "input_dir", 1, where.existing),
        ):
            if callable(vars(cls).get(name)):
                patches.wrap(cls, name, lambda orig, a=arg, i=at, f=to: _path_arg(orig, a, f, i))
        if callable(vars(cls).get("load_state")):
            patches.wrap(cls, "load_state", lambda orig: _accelerate_resumed(orig, where))

    def summary_writer(module: ModuleType) -> None:
        cls = getattr(module, "SummaryWriter", None)
        if cls is None:
            return

        def change(a: dict) -> None:  # without a log_dir: runs/<time>_<host> in the cwd
            a["log_dir"] = where.path(a.get("log_dir") or os.path.join(os.getcwd(), "runs"))

        edit_init(patches, cls, change)

    def safetensors_files(module: ModuleType) -> None:
        # Written from Rust, out of tryfix/userfiles' reach (the HF Trainer's and
        # save_pretrained's weights go through it). The filename: second, or first to load.
        for name, at, to in (("save_file", 1, where.file), ("save_model", 1, where.file),
                             ("load_file", 0, where.existing), ("load_model", 1, where.existing)):
            if callable(getattr(module, name, None)):
                patches.wrap(module, name,
                             lambda orig, i=at, f=to: _path_arg(orig, "filename", f, i))

    def pretrained(name: str) -> Callable[[ModuleType], None]:
        def patch(module: ModuleType) -> None:  # weights (safetensors), a tokenizer's files
            cls = getattr(module, name, None)
            if cls is not None and callable(vars(cls).get("save_pretrained")):
                patches.wrap(cls, "save_pretrained",
                             lambda orig: _path_arg(orig, "save_directory", where.path))

        return patch

    patches.after_import("safetensors.torch", safetensors_files)
    patches.after_import("transformers.modeling_utils", pretrained("PreTrainedModel"))
    patches.after_import("transformers.tokenization_utils_base",
                         pretrained("PreTrainedTokenizerBase"))
    patches.after_import("torch.utils.tensorboard.writer", summary_writer)
    patches.after_import("accelerate.utils.dataclasses", accelerate_project)
    patches.after_import("accelerate.accelerator", accelerator)
    patches.after_import("transformers.training_args", hf_arguments)
    patches.after_import("transformers.trainer", hf_trainer)
    for package in _LIGHTNING_PACKAGES:
        patches.after_import(f"{package}.trainer.trainer", lightning_trainer)
        patches.after_import(f"{package}.callbacks.model_checkpoint",
                             lightning_class("ModelCheckpoint", "dirpath"))
        patches.after_import(f"{package}.loggers.tensorboard",
                             lightning_class("TensorBoardLogger", "save_dir"))
        patches.after_import(f"{package}.loggers.csv_logs",
                             lightning_class("CSVLogger", "save_dir"))
    return where


def _folders_after(orig: Callable[..., Any], where: Elsewhere, *names: str) -> Callable[..., Any]:
    """A method that sets an object's folders (HF's TrainingArguments, accelerate's
    ProjectConfiguration), with the folders `names` that it leaves set redirected after it."""

    @functools.wraps(orig)
    def method(obj: Any, *args: Any, **kwargs: Any) -> Any:
        result = orig(obj, *args, **kwargs)
        for name in names:
            if getattr(obj, name, None) is not None:
                setattr(obj, name, where.path(getattr(obj, name)))
        return result

    return method


def _resumed(
    orig: Callable[..., Any], where: Elsewhere, last: Callable[[str], str | None]
) -> Callable[..., Any]:
    """The HF Trainer's `train(resume_from_checkpoint=True)`: the last checkpoint of the
    script's own `output_dir` (read, not written), as in the run; the round's folder has none,
    and the Trainer would raise that none was found."""

    @functools.wraps(orig)
    def train(trainer: Any, *args: Any, **kwargs: Any) -> Any:
        resume = args[0] if args else kwargs.get("resume_from_checkpoint")
        out = getattr(getattr(trainer, "args", None), "output_dir", None)
        mine = where.originals.get(os.path.abspath(out)) if isinstance(out, str) else None
        if resume is True and mine and os.path.isdir(mine) and (found := last(mine)):
            if args:
                args = (found, *args[1:])
            else:
                kwargs["resume_from_checkpoint"] = found
        return orig(trainer, *args, **kwargs)

    return train


def _accelerate_resumed(orig: Callable[..., Any], where: Elsewhere) -> Callable[..., Any]:
    """accelerate's `load_state()` with automatic checkpoint naming: the latest checkpoint of the
    round's `project_dir/checkpoints` where it saved one, else the run's (read, not written);
    the round's folder has none at first, and accelerate would fail to list it."""

    @functools.wraps(orig)
    def load_state(acc: Any, input_dir: Any = None, *args: Any, **kwargs: Any) -> Any:
        config = getattr(acc, "project_configuration", None)
        project = getattr(config, "project_dir", None)
        if input_dir is None and getattr(config, "automatic_checkpoint_naming", False) and project:
            mine = os.path.join(project, "checkpoints")
            theirs = os.path.join(where.originals.get(os.path.abspath(project), project),
                                  "checkpoints")
            if not (os.path.isdir(mine) and os.listdir(mine)) and os.path.isdir(theirs):
                input_dir = _latest(theirs)
        return orig(acc, input_dir, *args, **kwargs)

    return load_state


def _latest(folder: str) -> str | None:
    """The checkpoint folder with the highest trailing number in `folder`, as accelerate picks
    it (None: none)."""
    numbered = []
    for name in os.listdir(folder):
        found = re.search(r"(\d+)\D*$", name)
        if found:
            numbered.append((int(found.group(1)), os.path.join(folder, name)))
    return max(numbered)[1] if numbered else None


def _with_path(
    args: tuple, kwargs: dict, name: str, to: Callable[[Any], str | None], at: int
) -> tuple[tuple, dict]:
    """(args, kwargs) with the path argument `name` (positional at index `at`) replaced by
    `to(path)` where that is not None; other arguments (a buffer, None) as they were."""
    if len(args) > at and isinstance(args[at], (str, os.PathLike)):
        there = to(args[at])
        if there is not None:
            args = (*args[:at], there, *args[at + 1 :])
    elif isinstance(kwargs.get(name), (str, os.PathLike)):
        there = to(kwargs[name])
        if there is not None:
            kwargs = {**kwargs, name: there}
    return args, kwargs


def _path_arg(
    orig: Callable[..., Any], name: str, to: Callable[[Any], str | None], at: int = 1
) -> Callable[..., Any]:
    """`orig` with its path argument `name` (positional at `at`, counting `self` or torch.save's
    object) redirected by `to`."""

    @functools.wraps(orig)
    def call(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = _with_path(args, kwargs, name, to, at)
        return orig(*args, **kwargs)

    return call
