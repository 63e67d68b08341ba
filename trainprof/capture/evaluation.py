"""Evaluation passes inside training: `trainprof/eval:<kind>` ranges, and the steps that held them.

Lightning validates between two optimizer steps (and HF Trainer evaluates after one), so the
step that follows holds a whole evaluation epoch: its time and its fetches are not training.
Three sources, the first that applies:

* Lightning: `_EvaluationLoop.run` (validation, test, sanity check) and `_PredictionLoop.run`,
  of `pytorch_lightning` or `lightning.pytorch`,
* HF transformers: `Trainer.evaluate` and `Trainer.predict`,
* any other: a root-module forward while that module is in eval mode and grad is off
  (`model.eval()` + `torch.no_grad()` / `inference_mode()`), for a module that earlier ran in
  training mode with grad (a frozen teacher never did); probes.py's root-forward probe checks.
  The stepper drops these when they fall in most steps (RL rollouts, EMA targets).

Frameworks are never imported by trainprof: each is patched right after the script imports it.
The stepper keeps which step each pass fell into (`Stepper.on_eval`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch.autograd.profiler import record_function

from trainprof.capture.compat import is_compiling
from trainprof.capture.patching import Patches
from trainprof.capture.state import S
from trainprof.capture.stepper import GENERIC_EVAL, Stepper

EVAL_RANGE = "trainprof/eval:"
GENERIC = GENERIC_EVAL
_LOOPS = ("evaluation_loop", "_EvaluationLoop"), ("prediction_loop", "_PredictionLoop")
_LIGHTNING = ("pytorch_lightning.loops.", "lightning.pytorch.loops.")


def _lightning_kind(loop: Any) -> str:
    trainer = getattr(loop, "trainer", None)
    if getattr(trainer, "sanity_checking", False):
        return "Lightning sanity check"
    stage = getattr(getattr(loop, "_stage", None), "value", "predict")
    return {"validate": "Lightning validation", "test": "Lightning test"}.get(
        stage, f"Lightning {stage}"
    )


def _hf_kind(name: str) -> Callable[[Any], str]:
    return lambda trainer: f"HF Trainer {name}"


class EvalSupport:
    def __init__(self, patches: Patches, stepper: Stepper) -> None:
        self.patches = patches
        self.stepper = stepper
        self.done: set[str] = set()

    def install(self) -> None:
        targets: dict[str, Callable[[ModuleType], None]] = {
            "transformers.trainer": self._patch_hf,
        }
        for prefix in _LIGHTNING:
            for mod, cls in _LOOPS:
                targets[prefix + mod] = functools.partial(self._patch_loop, cls)
        for name, patch in targets.items():
            self.patches.after_import(name, patch)

    def _patch_loop(self, cls_name: str, module: ModuleType) -> None:
        cls = getattr(module, cls_name, None)
        key = f"{module.__name__}.{cls_name}"
        if cls is None or key in self.done or not callable(vars(cls).get("run")):
            return
        self.done.add(key)
        self.patches.wrap(cls, "run", lambda orig: self._wrap(orig, _lightning_kind))

    def _patch_hf(self, module: ModuleType) -> None:
        cls = getattr(module, "Trainer", None)
        if cls is None or "hf" in self.done:
            return
        self.done.add("hf")
        for name in ("evaluate", "predict"):
            if callable(vars(cls).get(name)):
                self.patches.wrap(cls, name, lambda orig, n=name: self._wrap(orig, _hf_kind(n)))

    def _wrap(self, orig: Callable[..., Any], kind_of: Callable[[Any], str]) -> Callable[..., Any]:
        stepper = self.stepper

        @functools.wraps(orig)
        def run(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if (
                is_compiling()
                or not S.enabled
                or S.eval_depth  # HF predict inside evaluate, a loop inside a loop
                or threading.get_ident() != S.main_thread
            ):
                return orig(obj, *args, **kwargs)
            kind = kind_of(obj)
            stepper.on_eval(kind)
            S.eval_depth += 1
            try:
                if not S.recording:
                    return orig(obj, *args, **kwargs)
                with record_function(EVAL_RANGE + kind):
                    return orig(obj, *args, **kwargs)
            finally:
                S.eval_depth -= 1

        return run


def is_eval_forward(module: Any) -> bool:
    """A root forward that evaluates: the module is in eval mode and grad is off (the caller
    checked S.eval_depth: inside a framework's evaluation loop the loop is the pass)."""
    return not module.training and not torch.is_grad_enabled()
