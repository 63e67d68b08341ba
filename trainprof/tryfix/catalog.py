"""Which fixes `trainprof try` can apply at runtime, their variants, and how each is described:
what the variant changes, and the code change that makes it permanent. Torch-free.

A variant is a list of fix specs `{"rule": id, "options": {...}}` passed to a round as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainprof.analysis.kinds import RECEIVING
from trainprof.analysis.loader_cuts import EVAL_PREFETCH, evaluation_fix, place_names

# The prefetch_factor `try` gives the DataLoader's workers (tryfix/apply): four batches in hand
# each ride out a slow stretch of the loop's; the DataLoader estimate of each worker count is
# solved with it (tryfix/estimates), as it bounds what workers make ahead during an evaluation.
PREFETCH = 4


@dataclass(frozen=True)
class FixInfo:
    needs_cuda: bool = False  # the fix only changes anything on a CUDA device
    summary: str = ""


RUNTIME: dict[str, FixInfo] = {
    "dataloader-starvation": FixInfo(summary="DataLoader worker processes"),
    "pageable-memcpy": FixInfo(True, "pinned host memory, asynchronous host-to-device copies"),
    "zero-grad-not-none": FixInfo(summary="zero_grad(set_to_none=True)"),
    "optimizer-foreach": FixInfo(summary="multi-tensor (foreach) or fused optimizer step"),
    "cudnn-benchmark-off": FixInfo(True, "torch.backends.cudnn.benchmark = True"),
    "tf32-off": FixInfo(True, "TF32 matmuls and convolutions"),
    "metric-sync": FixInfo(summary='TorchMetrics aggregators with nan_strategy="disable"'),
    "no-amp": FixInfo(True, "bf16 autocast around the model's forward"),
    "cpu-bf16": FixInfo(summary="bf16 autocast around the model's forward"),
    "launch-bound": FixInfo(summary="torch.compile of the model"),
}

# Findings whose fix is a change to the user's own loop: listed, never run.
EDIT_THE_CODE = {
    "host-sync": "keep the value on the device; read it every N steps (the read is in your loop)",
    "per-step-logging": "log every N steps (the logging call is in your loop)",
    "h2d-in-loop": "create the tensor on the device, or once outside the loop",
    "conv-bias-before-bn": "nn.Conv2d(..., bias=False) before BatchNorm (changes the model)",
    "compile-recompile": "fix the shapes or graph breaks that make torch.compile recompile",
    "fp16-dims": "pad the dimensions to multiples of 8 (changes the model)",
    "batch-size": "raise batch_size and scale the learning rate (changes the training)",
    "memory-pressure": "activation checkpointing, AMP or a smaller batch",
    "comm-bound": "DDP bucket sizes, no_sync() with accumulation",
    "gpu-idle": "move that CPU work off the step",
    "iterable-duplicates": "split the IterableDataset's stream between workers in its __iter__ "
    "(get_worker_info)",
}
# A GPU run's dataloader-starvation finding whose workers fill the CPUs (its metrics["kind"] is
# analysis/kinds.CPU_BOUND): more workers make no more batches
PIPELINE = ("less CPU work per batch (augmentation on the GPU, NVIDIA DALI, decoded samples "
            "cached) or more CPUs: the workers fill them")

# rules whose variants share one model-forward patch: never combined twice
AUTOCAST_RULES = ("no-amp", "cpu-bf16")

# The rules whose fix a round can switch off and on between two steps (tryfix/switch: a flag
# read at each call), measured that way unless `trainprof try --separate`.
SWITCHABLE = frozenset({"zero-grad-not-none", "optimizer-foreach", "cpu-bf16", "no-amp"})


def switchable(rule: str, cuda: bool) -> bool:
    """Whether `rule`'s fix is measured switched in blocks inside one round. Not the optimizer's
    flags on a GPU: Adam's step counters live on the GPU when fused and on the CPU otherwise
    (torch.optim makes them at the first step), so the side that did not make them would run
    with the other's: a sync per step, or a device mismatch."""
    return rule in SWITCHABLE and not (cuda and rule == "optimizer-foreach")


def worker_counts(cores: int, baseline: int | None) -> list[int]:
    """0, 1, 2, 4, ... up to the cores, without the script's own setting."""
    counts = [0, 1]
    n = 2
    while n <= max(cores, 1):
        counts.append(n)
        n *= 2
    if cores > 1 and cores not in counts:
        counts.append(cores)
    return [c for c in counts if c != baseline]


FILE_SYSTEM = "file_system"
# torch.compile's CUDA-graph mode: what launch-bound's estimate models on a GPU
REDUCE_OVERHEAD = "reduce-overhead"


def variants_for(
    rule: str,
    cores: int,
    cuda: bool,
    baseline_workers: int | None,
    threads: int | None = None,
    kind: str | None = None,
    pinned: bool = False,
    evaluation: list[str] | None = None,
    channels_last: bool | None = None,
) -> list[dict]:
    """The option sets to measure for `rule` (several: a sweep, the best one kept). `threads`:
    the run's intra-op threads (None: unknown). `kind`: the kind of the run's finding for `rule`
    (dataloader-starvation: "receiving" measures that finding's own fixes, not more workers);
    `pinned`: the run's DataLoaders already use pin_memory=True; `evaluation`: where the
    evaluation loaders the script leaves before their end are built (file:line), given
    prefetch_factor EVAL_PREFETCH with workers (analysis/loader_cuts); `channels_last`: the
    layout cpu-bf16's estimate took for a CNN (analysis/bf16_layout; the fix's default,
    channels-last, unless the model's own layout was measured faster)."""
    if rule == "cpu-bf16" and channels_last is False:
        return [{"channels_last": False}]
    if rule == "launch-bound" and cuda:
        # The estimate is the launch gaps of the model's forward and backward, which CUDA graphs
        # remove; the default mode fuses element-wise chains but launches each kernel it keeps
        # (an H100, amp_compile's CNN: 38.7 % estimated, the default mode measured -8.8 %).
        # Both are measured, the better kept.
        return [{}, {"mode": REDUCE_OVERHEAD}]
    if rule == "dataloader-starvation" and kind == RECEIVING:
        # Workers that keep up: more would not help. torch's file_system strategy maps each
        # tensor by name instead of a socket hand-shake with the worker per tensor; on a GPU
        # pin_memory=True moves the receiving to the pin-memory thread.
        out: list[dict] = [{"sharing_strategy": FILE_SYSTEM}]
        if cuda and not pinned:
            out.append({"pin_memory": True})
        return out
    if rule == "dataloader-starvation":
        out = []
        lowered: list[int] = []
        for n in worker_counts(cores, baseline_workers):
            opts: dict[str, Any] = {"num_workers": n}
            if n and evaluation:
                opts["evaluation_loaders"] = list(evaluation)
            if n and not cuda:
                # On a CPU run the workers and the model's intra-op threads share the cores:
                # oversubscribed OpenMP threads spin and make the step slower than no workers.
                # Lowered only: a run already on fewer threads keeps them (no change to split).
                want = max(1, cores - n)
                if threads is None or want < threads:
                    opts["threads"] = want
                    lowered.append(want)
            out.append(opts)
        if not cuda and lowered:
            # Control: the (first) thread change alone, so that the sweep shows how much of its
            # saving comes from the workers (never picked as the fix).
            out.append({"threads": lowered[0], "control": True})
        return out
    return [{}]


def change_text(rule: str, options: dict) -> str:
    """What this variant changes, in one line."""
    if rule == "dataloader-starvation" and options.get("sharing_strategy"):
        return (f'torch.multiprocessing.set_sharing_strategy("{options["sharing_strategy"]}") '
                "in the script's process and its DataLoader workers")
    if rule == "dataloader-starvation" and options.get("pin_memory"):
        return "DataLoader(pin_memory=True) (batches received on the pin-memory thread)"
    if rule == "dataloader-starvation":
        if options.get("control"):
            return f"torch.set_num_threads({options['threads']}) only (control: DataLoader as is)"
        n = options.get("num_workers", 0)
        if not n:
            return "DataLoader(num_workers=0)"
        text = f"DataLoader(num_workers={n}, persistent_workers=True, prefetch_factor={PREFETCH})"
        if options.get("evaluation_loaders"):
            text += (f" + prefetch_factor={EVAL_PREFETCH} for the evaluation loader built at "
                     f"{place_names(options['evaluation_loaders'])}")
        if options.get("threads"):
            text += f" + torch.set_num_threads({options['threads']})"
        return text
    if rule == "launch-bound" and options.get("mode"):
        return (f'torch.compile of the root module, mode="{options["mode"]}" (CUDA graphs; '
                "compile time not timed)")
    if rule == "cpu-bf16" and options.get("channels_last") is False:
        return ("bf16 autocast around the root module's forward, the model in its own layout "
                "(channels-last measured slower) (numerics change)")
    return {
        "pageable-memcpy": "DataLoader(pin_memory=True) + .to('cuda', non_blocking=True) "
        "for host-to-device copies",
        "zero-grad-not-none": "optimizer.zero_grad(set_to_none=True), model.zero_grad(...) too",
        "optimizer-foreach": "torch.optim: fused=True where supported (Adam, AdamW, SGD, "
        "Adagrad), else foreach=True",
        "cudnn-benchmark-off": "torch.backends.cudnn.benchmark = True (held)",
        "tf32-off": "TF32 on for matmuls and cuDNN (held)",
        "metric-sync": 'TorchMetrics Mean/Sum/Max/Min/CatMetric(nan_strategy="disable")',
        "no-amp": "bf16 autocast around the root module's forward (numerics change)",
        "cpu-bf16": "bf16 autocast around the root module's forward, channels-last for a CNN "
        "(numerics change)",
        "launch-bound": "torch.compile of the root module (compile time not timed)",
    }.get(rule, rule)


FUSED_CLASSES = ("Adam", "AdamW", "SGD", "Adagrad")


def permanent_text(rule: str, options: dict, optimizer: str | None = None) -> str:
    """The code change that makes the fix permanent (`optimizer`: the run's optimizer class)."""
    if rule == "optimizer-foreach" and optimizer:
        flag = "fused=True" if optimizer in FUSED_CLASSES else "foreach=True"
        return f"torch.optim.{optimizer}(params, ..., {flag})"
    if rule == "launch-bound" and options.get("mode"):
        return f'model = torch.compile(model, mode="{options["mode"]}")'
    if rule == "cpu-bf16" and options.get("channels_last") is False:
        return ('with torch.autocast(device_type="cpu", dtype=torch.bfloat16): '
                "loss = criterion(model(x), y)  # the model in its own layout")
    if rule == "dataloader-starvation" and options.get("sharing_strategy"):
        # torch's docs: names in /dev/shm can outlive a process that is killed
        return (f'import torch.multiprocessing; torch.multiprocessing.set_sharing_strategy('
                f'"{options["sharing_strategy"]}")  # near the top of the script, before any '
                "DataLoader; files in /dev/shm may be left behind if the process is killed")
    if rule == "dataloader-starvation" and options.get("pin_memory"):
        return "DataLoader(..., pin_memory=True)"
    if rule == "dataloader-starvation":
        n = options.get("num_workers", 0)
        if not n:
            return "DataLoader(..., num_workers=0)"
        text = (f"DataLoader(..., num_workers={n}, persistent_workers=True, "
                f"prefetch_factor={PREFETCH})")
        if options.get("evaluation_loaders"):
            text += (f"; {evaluation_fix(n, options['evaluation_loaders'])} (the script leaves "
                     "its iterators before their end)")
        if options.get("threads"):
            text += f"; torch.set_num_threads({options['threads']}) (workers and model share " \
                    "the cores)"
        return text
    return {
        "pageable-memcpy": "DataLoader(..., pin_memory=True); x.to(device, non_blocking=True)",
        "zero-grad-not-none": "optimizer.zero_grad(set_to_none=True)",
        "optimizer-foreach": "torch.optim.AdamW(params, ..., fused=True)  # or foreach=True",
        "cudnn-benchmark-off": "torch.backends.cudnn.benchmark = True",
        "tf32-off": 'torch.set_float32_matmul_precision("high"); '
        "torch.backends.cudnn.allow_tf32 = True",
        "metric-sync": 'MeanMetric(nan_strategy="disable")  # likewise Sum/Max/Min/CatMetric',
        "no-amp": "with torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16): "
        "loss = criterion(model(x), y)",
        "cpu-bf16": "model = model.to(memory_format=torch.channels_last)  # a CNN; then "
        "with torch.autocast(device_type=\"cpu\", dtype=torch.bfloat16): "
        "loss = criterion(model(x), y)",
        "launch-bound": "model = torch.compile(model)",
    }.get(rule, rule)
