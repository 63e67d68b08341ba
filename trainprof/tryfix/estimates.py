"""What `trainprof try` takes from the run's diagnosis: each rule's estimated saving, its fix
text and kind; and what the diagnosis's own model says of what `try` runs that the diagnosis did
not suggest: the DataLoader sweep's other worker counts, and all fixes together.

All fixes together are not the sum of their estimates where a DataLoader model holds the step:
shortening the model's compute (bf16 autocast, a fused optimizer) can leave the workers' rate
the bound. many_problems on two cores: the estimates summed to 50.5 %, one worker and bf16
together measured +30.5 %, the model with bf16's saving in its compute says 30.6 %.

Nor where one fix slows another's part: `cpu-bf16`'s fix makes a CNN's weights channels-last,
where torch's fused CPU optimizers run several times slower (capture/optprobe). metrics_sync's
ResNet: `cpu-bf16` measured +20.4 to +22.2 %, fused SGD +1.1 to +2.9 %, the two together +15.3 %
against a sum of 22.0 %. The fused step's extra time on channels-last weights, timed after the
run, is taken off the sum.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainprof.analysis import kinds
from trainprof.analysis.loader_workers import step_with
from trainprof.errors import TrainprofError
from trainprof.tryfix import catalog

LOADER = "dataloader-starvation"

# Why a rule that has a finding has no estimate (its findings claim nothing).
NO_CLAIM = {
    kinds.RECEIVING: "not estimated: the diagnosis claims no saving for receiving batches from "
    "DataLoader workers on a CPU run, or with pin_memory=True already",
    kinds.CPU_OVERHEAD: "not estimated: on a CPU run the diagnosis claims no saving for "
    "torch.compile (the per-op cost it removes and the fixed cost it adds to every call depend "
    "on the model)",
}

# How the estimate of all fixes together was made (try.json: combined.estimate_basis).
MODEL = "model"  # the DataLoader model, the other fixes' savings taken off its compute
SUM = "sum"  # the sum of the estimates: fixes that act on separate parts of the step


@dataclass
class RunEstimates:
    """What `try` takes from the run's diagnosis, per rule."""

    est: dict[str, float | None] = field(default_factory=dict)  # None: a finding, no claim
    fix: dict[str, str] = field(default_factory=dict)  # the finding's fix text
    kind: dict[str, str] = field(default_factory=dict)  # the findings' metrics["kind"], if any
    # rules whose estimate includes the intra-op thread change the worker variants make
    # (dataloader-starvation's metrics["threads_modelled"]): checked against the whole variant
    threads_modelled: set[str] = field(default_factory=set)
    # [lo, hi] %: the estimate's spread within the run, where the finding gives one (a rule with
    # one finding: dataloader-starvation's CPU estimate, metrics saving_lo_pct / saving_hi_pct)
    spread: dict[str, list[float]] = field(default_factory=dict)
    note: str | None = None  # why there is no diagnosis
    # the step the estimates are shares of: (ms, "unprofiled" | "profiled"), None: no diagnosis
    basis: tuple[float, str] | None = None
    # The metrics of the run's one dataloader-starvation finding where they hold its CPU model
    # (analysis/loader_workers.step_with), else None (a GPU run, several loaders, no finding).
    loader: dict[str, Any] | None = None
    # % per rule where the loader's workers cut a saving of the loop's own work to their
    # headroom (analysis/loader_bound: metrics["unbound_saving_pct"]): the rule's findings as
    # they claimed them before the cut, what they save beside more workers
    unbound: dict[str, float] = field(default_factory=dict)
    # % per rule: what its fix costs on top of its estimate once the model is channels-last
    # (optimizer-foreach's metrics["channels_last_cost_pct"]), and whether cpu-bf16's fix makes
    # the model so (its metrics["channels_last"])
    channels_last_cost: dict[str, float] = field(default_factory=dict)
    bf16_channels_last: bool = False
    # % that cpu-bf16's fix would save less in the model's own layout, where it takes
    # channels-last and the probe timed both (its metrics["own_layout_less_pct"]); None: not known
    own_layout_less: float | None = None
    # A GPU run's one dataloader-starvation finding without a CPU model: its saving (%) for n = 1,
    # 2, ... workers (metrics["gpu_saving_by_workers"]), held to the finding's own, and the count
    # it suggested; empty and None otherwise
    gpu_by_workers: list[float] = field(default_factory=list)
    gpu_suggested: int | None = None
    # On a GPU: the GPU idle of the step without the profiler (%), which the fixes of the
    # host's side save at most, together as alone (metrics["unprofiled_gpu_idle_pct"],
    # analysis/gpu_headroom), and the rules whose findings it bounds
    idle_bound: float | None = None
    idle_rules: set[str] = field(default_factory=set)

    def suggested_workers(self) -> int | None:
        """The worker count the diagnosis suggested (its estimate is for that count)."""
        n = self.loader.get("suggested_num_workers") if self.loader else None
        return n if isinstance(n, int) else None

    def for_workers(self, rule: str, options: dict[str, Any]) -> float | None:
        """The CPU model's estimate (%) for one of the DataLoader sweep's worker counts other than
        the suggested one (the diagnosis's own estimate is for that), and for that one too where
        the run evaluates every few steps (the workers fetch ahead meanwhile, up to `try`'s
        prefetch factor); None for anything else, or without the model."""
        n = options.get("num_workers")  # none in the sweep's thread-only control
        if rule != LOADER or not isinstance(n, int) or n < 1:
            return None
        if self.loader is None and self.gpu_by_workers:
            by_n = self.gpu_by_workers
            return None if n == self.gpu_suggested else by_n[min(n, len(by_n)) - 1]
        # The suggestion's own estimate, unless the run evaluates every few steps or leaves
        # iterators before their end: then what the workers make ahead meanwhile depends on the
        # prefetch factor, `try`'s not the suggestion's.
        ahead = bool(self.loader and (self.loader.get("eval_every_steps")
                                      or self.loader.get("cut_iterators_per_step")))
        return None if n == self.suggested_workers() and not ahead else self._loader_pct(n, 0.0)

    def spread_for(self, rule: str, options: dict[str, Any]) -> list[float] | None:
        """The spread within the run ([lo, hi] %) of the estimate for one option set: the
        finding's where the estimate is the finding's own, the CPU model's at that worker count
        where it is the model's (at the suggested prefetch: none where the run evaluates every
        few steps or leaves iterators before their end), None for the sweep's control and its
        no-workers variant."""
        if options.get("control") or (rule == LOADER and options.get("num_workers") == 0):
            return None
        if self.for_workers(rule, options) is None:
            return self.spread.get(rule)
        n, metrics = options["num_workers"], self.loader or {}
        los, his = metrics.get("saving_lo_by_workers"), metrics.get("saving_hi_by_workers")
        if (metrics.get("eval_every_steps") or metrics.get("cut_iterators_per_step")
                or not isinstance(los, list) or not isinstance(his, list)
                or not 1 <= n <= min(len(los), len(his))):
            return None
        return [los[n - 1], his[n - 1]]

    def together(self, specs: Iterable[dict[str, Any]]) -> tuple[float | None, str]:
        """The estimate (%) of the fixes in `specs` applied together, and how it was made (MODEL
        or SUM); None where no fix in it has an estimate."""
        specs = list(specs)
        rules = [s["rule"] for s in specs]
        known = [e for e in (self.est.get(r) for r in rules) if e is not None]
        cost = self.cost_between(rules)
        loader = next((s for s in specs if s["rule"] == LOADER), None)
        n = loader["options"].get("num_workers") if loader else None
        if isinstance(n, int) and n >= 1 and self.loader is not None:
            step = float(self.loader["unprofiled_step_ms"])
            # the loop's savings as they are once the workers keep up: the model says whether
            # they do with `n` workers
            others = sum(e for r in rules if r != LOADER
                         and (e := self.unbound.get(r, self.est.get(r))) is not None) - cost
            pct = self._loader_pct(n, max(others, 0.0) / 100 * step)
            if pct is not None:
                return pct, MODEL
        if not known:
            return None, SUM
        total = sum(known) - cost - self.idle_over(rules)
        return round(max(min(total, 100.0), 0.0), 1), SUM

    def idle_over(self, rules: Iterable[str]) -> float:
        """How much the estimates of the fixes of the host's side among `rules` add up to over
        the GPU idle of the step without the profiler (%): together they remove that idle at
        most, as each alone does (the H200 run of metric_sync.py: 6.8 % of idle)."""
        if self.idle_bound is None:
            return 0.0
        idle = sum(e for r in set(rules) & self.idle_rules if (e := self.est.get(r)) is not None)
        return round(max(idle - self.idle_bound, 0.0), 2)

    def cost_between(self, rules: Iterable[str]) -> float:
        """What the fixes of `rules` cost each other (% of the step), taken off their estimate
        together: a fused optimizer on the channels-last weights of cpu-bf16's fix, or, where
        that is less, what cpu-bf16's fix saves less in the model's own layout
        (`own_layout_together` says which)."""
        rules = list(rules)
        if "cpu-bf16" not in rules or not self.bf16_channels_last:
            return 0.0
        if self.own_layout_together(rules):
            return round(self.own_layout_less or 0.0, 2)
        return round(sum(self.channels_last_cost.get(r, 0.0) for r in rules), 2)

    def own_layout_together(self, rules: Iterable[str]) -> bool:
        """Whether cpu-bf16's fix, among `rules` and channels-last alone, keeps the model's own
        layout there: where a fused optimizer among them would take more on channels-last
        weights than the fix saves less in the own layout (a fused SGD on metrics_sync's
        ResNet: ~5 % of the step more, against ~2 % less). False without cpu-bf16 among them,
        where it keeps the own layout alone too, or where the loss is not known."""
        rules = list(rules)
        if "cpu-bf16" not in rules or not self.bf16_channels_last or self.own_layout_less is None:
            return False
        return sum(self.channels_last_cost.get(r, 0.0) for r in rules) > self.own_layout_less

    def _loader_pct(self, workers: int, less_compute_ms: float) -> float | None:
        if self.loader is None:
            return None
        step = float(self.loader["unprofiled_step_ms"])
        fixed = step_with(self.loader, workers, less_compute_ms, catalog.PREFETCH)
        if fixed is None or step <= 0:
            return None
        return round(max(100 * (step - fixed) / step, 0.0), 1)


def estimates(run: Path) -> RunEstimates:
    """Per rule: the estimated saving (% of the step, summed over its findings, at most 100;
    None where every finding of the rule claims nothing), the fix text and the finding's kind,
    from the run's diagnosis; and why there is none, if so."""
    from trainprof.diagnose import diagnose_path

    try:
        diags = diagnose_path(run)
    except TrainprofError as err:
        return RunEstimates(note=f"no diagnosis of {run}: {err}")
    except Exception as err:  # noqa: BLE001 - measuring does not need the estimates
        return RunEstimates(note=f"no diagnosis of {run}: {type(err).__name__}: {err}")
    out = RunEstimates()
    if diags and diags[0].saving_basis.step_ms > 0:
        out.basis = (diags[0].saving_basis.step_ms, diags[0].saving_basis.kind)
    kinds: dict[str, set[str]] = {}
    before: dict[str, float] = {}  # per rule, its findings' savings before the workers' cut
    cut: set[str] = set()  # the rules with a finding the cut reached
    for d in diags[:1]:
        for f in d.findings:
            kind = f.metrics.get("kind")
            if isinstance(kind, str):
                kinds.setdefault(f.rule, set()).add(kind)
            # A finding of a kind that makes no claim where it has no saving (a CPU run's
            # receiving, rules/dataloader_starvation.py; a CPU run's per-op overhead,
            # rules/launch_bound.py): not an estimate of 0.
            claims = not (kind in NO_CLAIM and not f.est_saving_pct)
            prev = out.est.get(f.rule)
            if claims:
                out.est[f.rule] = min(100.0, (prev or 0.0) + f.est_saving_pct)
            else:
                out.est.setdefault(f.rule, None)
            out.fix.setdefault(f.rule, f.fix)
            unbound = f.metrics.get("unbound_saving_pct")
            if claims:  # a finding the cut left alone counts as it stands
                whole = unbound if isinstance(unbound, (int, float)) else f.est_saving_pct
                before[f.rule] = before.get(f.rule, 0.0) + whole
                if isinstance(unbound, (int, float)):
                    cut.add(f.rule)
            if f.metrics.get("threads_modelled") == 1:
                out.threads_modelled.add(f.rule)
            lo, hi = f.metrics.get("saving_lo_pct"), f.metrics.get("saving_hi_pct")
            if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
                out.spread[f.rule] = [lo, hi]
            if f.rule == LOADER and "compute_ms_by_workers" in f.metrics:
                out.loader = dict(f.metrics)
            bound = f.metrics.get("unprofiled_gpu_idle_pct")
            if isinstance(bound, (int, float)):
                out.idle_bound = float(bound)
                out.idle_rules.add(f.rule)
            by_n = f.metrics.get("gpu_saving_by_workers")
            if f.rule == LOADER and isinstance(by_n, list) and by_n:
                out.gpu_by_workers = [min(float(v), f.est_saving_pct) for v in by_n]
                suggested = f.metrics.get("suggested_num_workers")
                out.gpu_suggested = suggested if isinstance(suggested, int) else None
            extra = f.metrics.get("channels_last_cost_pct")
            if isinstance(extra, (int, float)):
                out.channels_last_cost[f.rule] = out.channels_last_cost.get(f.rule, 0.0) + extra
            if f.rule == "cpu-bf16" and f.metrics.get("channels_last"):
                out.bf16_channels_last = True
                less = f.metrics.get("own_layout_less_pct")
                if isinstance(less, (int, float)):
                    out.own_layout_less = float(less)
    out.unbound = {r: min(100.0, before[r]) for r in cut}
    # A spread or a model is one finding's: with several findings of a rule (several loaders),
    # their sum has neither here.
    counts = Counter(f.rule for d in diags[:1] for f in d.findings)
    out.spread = {r: v for r, v in out.spread.items() if counts[r] == 1}
    if counts[LOADER] != 1:
        out.loader = None
        out.gpu_by_workers, out.gpu_suggested = [], None
    # One kind per rule; where findings differ (several loaders), none: the rule's usual fix.
    out.kind = {r: next(iter(k)) for r, k in kinds.items() if len(k) == 1}
    return out
