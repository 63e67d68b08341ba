"""Training frameworks (PyTorch Lightning, the Hugging Face Trainer, accelerate): how to recognise
them in a trace, and how a fix is said in their terms when they own the code that has to change.

A table read by the rules: a new framework, or a new fix, is an entry here, not a branch in each
rule. Fix topics (`Framework.fixes` keys): `dataloader` (more workers; `{workers}` is the
suggested count), `pin_memory`, `amp_bf16`, `amp_fp16`, `log` (a value read every step for
logging). `syncs` maps a library frame in a sync's Python stack to the knob that removes it; a
sync inside a framework's code that no knob removes is the library's own ("upstream").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trainprof.analysis.context import Context
from trainprof.trace.frames import library_path, parse_frame


@dataclass(frozen=True)
class KnownSync:
    frame: str  # regex searched in the library frames of the sync's stack
    fix: str
    labels: tuple[str, ...] = ()  # sync labels (item, is_nonzero, ...) it covers; () all
    # True: `frame` must be the library frame that does it (the innermost one outside torch);
    # False: any library frame on the way (Lightning's logger connector calls a helper).
    inner: bool = False


@dataclass(frozen=True)
class Framework:
    id: str
    name: str
    packages: tuple[str, ...]  # how its frames' files start (Kineto strips site-packages/)
    home: tuple[str, ...]  # the packages of its own logic (not shared utilities), for `via`
    drivers: str  # regex: a frame of this in a trace means the framework runs the loop
    issues: str  # where its own syncs are reported upstream
    pin_arg: str = "pin_memory=True"  # how its DataLoader settings say pin_memory
    fixes: dict[str, str] = field(default_factory=dict)
    syncs: tuple[KnownSync, ...] = ()


_LIGHTNING_LOG = (
    "Lightning turns every value logged with `prog_bar=True` or `on_step=True` into a Python "
    "number each step (its logger connector calls `.item()`): log per-step values with "
    "`self.log(name, value, on_step=False, on_epoch=True)` (accumulated on the device, read "
    "once per epoch), keep `prog_bar=True` for values you need to watch, and write to the "
    "logger less often with `Trainer(log_every_n_steps=50)`."
)

FRAMEWORKS: tuple[Framework, ...] = (
    Framework(
        id="lightning",
        name="PyTorch Lightning",
        packages=("pytorch_lightning/", "lightning/", "lightning_fabric/"),
        home=("pytorch_lightning/", "lightning/pytorch/"),
        drivers=r"^(pytorch_lightning|lightning/pytorch)/trainer/trainer\.py\(\d+\): fit$"
        r"|^(pytorch_lightning|lightning/pytorch)/loops/",
        issues="https://github.com/Lightning-AI/pytorch-lightning/issues",
        fixes={
            "dataloader": "Lightning uses your DataLoader as built: return "
            "`DataLoader(..., num_workers={workers}, persistent_workers=True{pin})` from "
            "`train_dataloader()` (or your LightningDataModule).",
            "pin_memory": "Return `DataLoader(..., pin_memory=True)` from `train_dataloader()`: "
            "Lightning then copies each batch to the GPU without blocking.",
            "amp_bf16": 'Trainer(precision="bf16-mixed")  # bf16 keeps fp32\'s range: no scaler',
            "amp_fp16": 'Trainer(precision="16-mixed")  # no bf16 before Ampere (compute 8.0)',
            "log": _LIGHTNING_LOG,
        },
        syncs=(
            KnownSync(
                r"/trainer/connectors/logger_connector/|lightning_fabric/utilities/apply_func"
                r"\.py\(\d+\): convert_tensors_to_scalars",
                _LIGHTNING_LOG,
            ),
        ),
    ),
    Framework(
        id="transformers",
        name="Hugging Face transformers",
        packages=("transformers/",),
        home=("transformers/",),
        drivers=r"^transformers/trainer\.py\(\d+\): (train|_inner_training_loop|_run_epoch)$",
        issues="https://github.com/huggingface/transformers/issues",
        pin_arg="dataloader_pin_memory=True",
        fixes={
            "dataloader": "TrainingArguments(dataloader_num_workers={workers}, "
            "dataloader_persistent_workers=True, dataloader_prefetch_factor=2{pin})",
            "pin_memory": "TrainingArguments(dataloader_pin_memory=True)  # the default: check "
            "nothing turns it off",
            "amp_bf16": "TrainingArguments(bf16=True)  # bf16 keeps fp32's range: no scaler",
            "amp_fp16": "TrainingArguments(fp16=True)  # no bf16 before Ampere (compute 8.0)",
            "log": "TrainingArguments(logging_steps=50): the Trainer reads the loss on the host "
            "at each logging step.",
        },
        syncs=(
            KnownSync(
                r"^transformers/trainer\.py\(\d+\): (_run_epoch|_inner_training_loop)$",
                "TrainingArguments(logging_nan_inf_filter=False): the Trainer checks every "
                "step's loss on the host (`torch.isnan(tr_loss_step) or "
                "torch.isinf(tr_loss_step)`) to leave nan/inf steps out of the logged loss; "
                "with the filter off it never branches on the loss.",
                labels=("is_nonzero",),
                inner=True,
            ),
            KnownSync(
                r"^transformers/trainer\.py\(\d+\): ",
                "TrainingArguments(logging_steps=50): the Trainer reads the loss on the host "
                "at each logging step.",
                labels=("item", "copy"),
                inner=True,
            ),
        ),
    ),
    Framework(
        id="accelerate",
        name="Hugging Face accelerate",
        packages=("accelerate/",),
        home=("accelerate/",),
        drivers=r"^accelerate/(accelerator|data_loader)\.py\(\d+\): ",
        issues="https://github.com/huggingface/accelerate/issues",
        fixes={
            "dataloader": "Build the DataLoader you pass to `accelerator.prepare()` with "
            "`DataLoader(..., num_workers={workers}, persistent_workers=True{pin})`: accelerate "
            "keeps its workers.",
            "pin_memory": "DataLoader(..., pin_memory=True) before `accelerator.prepare()`, and "
            "`Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=True))` so "
            "its copies to the GPU do not block.",
            "amp_bf16": 'Accelerator(mixed_precision="bf16")  # or `accelerate launch '
            "--mixed_precision bf16`",
            "amp_fp16": 'Accelerator(mixed_precision="fp16")  # no bf16 before Ampere',
        },
    ),
)

_BY_ID = {f.id: f for f in FRAMEWORKS}
FRAMEWORK_HOMES = tuple(p for f in FRAMEWORKS for p in f.home)


def owner(path: str) -> Framework | None:
    """The framework a library file belongs to."""
    path = library_path(path)
    return next((f for f in FRAMEWORKS if path.startswith(f.packages)), None)


def run_framework(ctx: Context) -> Framework | None:
    """The framework that runs the training loop, from the trace's Python frames; the first of
    the table wins (the HF Trainer runs on accelerate: transformers is listed first)."""
    return ctx.memo(_run_framework)


def _run_framework(ctx: Context) -> Framework | None:
    tr = ctx.trace
    return next((f for f in FRAMEWORKS if len(tr.name_ids(f.drivers))), None)


def run_fix(ctx: Context, topic: str, default: str, workers: int = 2, pin: bool = False) -> str:
    """`default`, or the framework's own way to say it when one runs the loop (`workers`,
    `pin`: what a DataLoader fix suggests)."""
    fw = run_framework(ctx)
    text = fw.fixes.get(topic) if fw else None
    if fw is None or text is None:
        return default
    return text.format(workers=workers, pin=f", {fw.pin_arg}" if pin else "")


@dataclass(frozen=True)
class SyncFix:
    fix: str
    framework: Framework | None
    upstream: bool  # the library's own code: nothing in the user's script issues it


def sync_fix(library: list[str], label: str, default: str) -> SyncFix:
    """The fix for a sync whose stack holds `library` (Kineto frame names, innermost first,
    from the read up to the user's frame, trainprof's own left out)."""
    doer = doing_frame(library)
    for name in library:
        fw = owner(_file(name))
        if fw is None:
            continue
        for known in fw.syncs:
            if known.labels and label not in known.labels or known.inner and name != doer:
                continue
            if re.search(known.frame, name):
                return SyncFix(known.fix, fw, upstream=False)
    inner = next((n for n in library if owner(_file(n))), None)
    if inner is None or not _only_framework_below(library, inner):
        return SyncFix(default, None, upstream=False)
    fw = owner(_file(inner))
    assert fw is not None
    return SyncFix(
        f"upstream: {function_label(inner)} ({fw.name}) does this in its own code; nothing in your "
        f"script issues it. Report it ({fw.issues}) or use a version without it. "
        f"The remedy, in the library's code: {default}",
        fw,
        upstream=True,
    )


def doing_frame(library: list[str]) -> str | None:
    """The library frame that does it: the innermost one outside torch."""
    return next((n for n in library if not library_path(_file(n)).startswith("torch/")), None)


def function_label(name: str) -> str:
    """`transformers.masking_utils._ignore_bidirectional_mask_sdpa` for a Kineto frame name."""
    f = parse_frame(name)
    if f is None:
        return name
    module = library_path(f[0]).removesuffix(".py").replace("/", ".")
    return module if f[2] == "?" else f"{module}.{f[2]}"  # "?": a probe's line, no function


def _file(name: str) -> str:
    f = parse_frame(name)
    return f[0] if f else ""


def _only_framework_below(library: list[str], inner: str) -> bool:
    """The innermost framework frame is the one doing it: only torch (or builtins) below it,
    no callback into other code."""
    for name in library:
        if name == inner:
            return True
        path = library_path(_file(name))
        if path and not path.startswith("torch/"):
            return False
    return True


def get(framework_id: str) -> Framework | None:
    return _BY_ID.get(framework_id)
