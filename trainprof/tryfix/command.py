"""`trainprof try RUN`: run the recorded command again, profiler off, without and with each fix,
interleaved (A B C, then B C A, C A B, ...: each round starts one place further along, so that a
drifting load does not favour a fixed position), and measure what each fix saves. Writes
RUN/try.json. A fix that can be switched off and on between two steps (catalog.switchable) is
measured inside its own rounds instead, switched in blocks of steps (tryfix/switch): both sides
under the same machine, seconds apart; its rounds still take their turn in the order. A fix that
changes the process runs in a process beside a baseline process, the two taking turns in blocks
of steps (tryfix/turns), unless --separate; on a CPU, a fix's variants share one baseline
process. The baseline's own rounds still run: the baseline's step and the machine's speed in the
rounds (tryfix/machine) are theirs.

Rounds run as subprocesses (`python -m trainprof.tryfix.round`, see round.py) in the working
folder and environment `trainprof run` recorded; a job's rounds are the job again on this
machine, through torchrun or through the script's own launch (tryfix/ranks), every rank with
the round's fixes (spawn.py), its fixes switched at the same step in every rank or in rounds of
their own, none in turns. Warm-up steps are dropped from every round (WARMUP_STEPS; with
torch.compile also the steps up to the first compilation and the one after it, and each later
recompilation's step and the one after it, listed in try.json as `recompile_steps`:
measure.timed_steps), and so are steps that hold an evaluation pass (`eval_steps`), as in the
run's diagnosis. Each fix that measured a saving is then run together with the others (the best
variant of each), again interleaved with the baseline. try.json is rewritten after every round,
so a Ctrl-C keeps the rounds done so far."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainprof.analysis import loader_cuts, loader_streams
from trainprof.analysis.bf16_layout import fix_channels_last
from trainprof.analysis.kinds import CPU_BOUND
from trainprof.errors import TrainprofError
from trainprof.fileio import write_atomic
from trainprof.runmeta import (
    TRY_NAME,
    DataLoaderInfo,
    RunMeta,
    earlier_tries,
    keep_earlier_try,
)
from trainprof.stats import BLOCK_STEPS
from trainprof.tryfix import catalog, machine, switch, turns
from trainprof.tryfix.estimates import LOADER, NO_CLAIM, SUM, estimates
from trainprof.tryfix.measure import (
    MAX_ROUNDS,
    Timed,
    pace,
    per_round,
    rounds_to_tell,
    saving,
    switched_rounds_to_tell,
    switched_saving,
    timed_steps,
    verdict,
    within_target,
)
from trainprof.tryfix.plan import (
    WARMUP_STEPS,
    default_steps,
    fit_block,
    script_end,
    switch_block,
)
from trainprof.tryfix.runfolder import changed_sources, job_of, load_run
from trainprof.tryfix.spawn import Launcher, read_result

LOG_NAME = "try.log"
SCHEMA = 1
DEFAULT_ROUNDS = 3
COMPILE_TIME_S = 600.0  # more time for a round that runs torch.compile


@dataclass
class Variant:
    name: str
    specs: list[dict]
    rounds: list[list[float]] = field(default_factory=list)  # kept step times (s) per round
    discarded: list[int] = field(default_factory=list)  # steps dropped at the start, per round
    recompiles: list[list[int]] = field(default_factory=list)  # later compile steps, per round
    evals: list[list[int]] = field(default_factory=list)  # steps holding an evaluation, per round
    ran: list[int] = field(default_factory=list)  # steps each round ran (the script may end first)
    refs: list[float] = field(default_factory=list)  # the reference (s) at kept steps' ends
    # > 0: measured switched in blocks of this many timed steps inside its own rounds
    # (tryfix/switch), `switched_off` the steps those rounds ran without the fix, per round
    block: int = 0
    switched_off: list[list[float]] = field(default_factory=list)
    # with `block`: in processes that take turns (tryfix/turns), not switched in one
    turns: bool = False
    # in turns, beside a baseline process of its own, not one shared with the rule's other
    # variants (a shared one failed)
    alone: bool = False
    # in turns: the changes of the variants its last round shared its baseline process with
    beside: list[str] = field(default_factory=list)
    error: str | None = None
    skipped: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class TryOptions:
    run: Path
    fixes: list[str] = field(default_factory=list)
    rounds: int = DEFAULT_ROUNDS
    steps: int | None = None
    separate: bool = False  # every fix in rounds of its own, none switched (tryfix/switch)


def _within_streams(options: list[dict], loaders: list[DataLoaderInfo]) -> list[dict]:
    """The sweep without worker counts past a dataset's shards: those workers get none of the
    stream (analysis/loader_streams)."""
    cap = loader_streams.shard_cap(loaders)
    if cap is None:
        return options
    return [o for o in options if o.get("num_workers", 0) <= cap]


def _stream_notes(options: dict, loaders: list[DataLoaderInfo]) -> list[str]:
    """What a variant's workers do to a dataset that does not split its stream."""
    n = options.get("num_workers", 0)
    found = loader_streams.unsplit(loaders) if n > 1 else []
    if not found:
        return []
    names = loader_streams.dataset_names(found)
    return [f"{names} (an IterableDataset) is not seen to split its samples between workers: "
            f"in these rounds each of the {n} workers ran all of it. The step is timed as a "
            "split dataset's would be; split it before you keep the change, or a stream read "
            "from data yields every sample once per worker (`trainprof diagnose` says how)"]


class Trial:
    def __init__(self, opts: TryOptions, meta: RunMeta) -> None:
        self.opts = opts
        self.run = Path(opts.run)
        self.meta = meta
        self.cuda = bool(meta.devices) and meta.devices != ["mps"]
        self.steps = opts.steps or default_steps(meta)
        # A switched round times both sides: about as many steps on each as a plain round keeps.
        self.block = switch_block(meta)
        # a switched round's blocks fit between the script's evaluation passes, where it ends soon
        self.switched_block = fit_block(meta, self.block, self.steps)
        self.switched_steps = switch.steps_for(self.steps - WARMUP_STEPS, self.switched_block,
                                               WARMUP_STEPS)
        # A round of turns: for each variant as many blocks as a switched round, half in its
        # process, half in the baseline's.
        self.turn_cycles = turns.cycles_for(self.steps - WARMUP_STEPS, self.block)
        self.turn_steps = turns.own_steps(
            turns.own_blocks(turns.schedule(self.turn_cycles, 0), 1), self.block, WARMUP_STEPS)
        found = self.found = estimates(self.run)
        self.est, self.rule_fix, self.est_note = found.est, found.fix, found.note
        self.kind = found.kind
        self.threads_modelled = found.threads_modelled
        self.basis = found.basis
        self.base = Variant("baseline", [])
        self.by_rule: dict[str, list[Variant]] = {}
        self.edit: list[dict] = []
        self.combined: Variant | None = None
        self.others: list[float] = []  # CPUs other processes kept busy, each round's (any variant)
        self.steals: list[float] = []  # the hypervisor's steal (Load.steal_share), each round's
        self.combined_note: str | None = None
        self.interrupted = False
        self.stopped: str | None = None  # why the rounds ended early, other than Ctrl-C
        self.log = self.run / LOG_NAME
        # The user's files that differ from what the run ran (its kept copies, capture/sources)
        self.sources_changed = changed_sources(self.run, meta)
        # A job's rounds are the job again, on this machine (spawn.Launcher).
        self.job = job_of(self.run)
        self.ranks = self.job.ranks if self.job else None
        self.launcher = Launcher(meta, self.log, self.job)
        self.clocks: set[str] = set()  # the step clocks the rounds were timed on
        # The script's own profiler in the rounds (tryfix/outputs): the kinds that started, the
        # files its exports did not write.
        self.script_profiler: dict[str, set[str]] = {"started": set(), "unwritten": set()}
        self.redirected: set[str] = set()  # the script's paths the rounds wrote elsewhere

    # ----- planning ----------------------------------------------------------------------------
    def plan(self) -> None:
        asked = list(dict.fromkeys(self.opts.fixes))
        known = set(catalog.RUNTIME) | set(catalog.EDIT_THE_CODE)
        unknown = [r for r in asked if r not in known]
        if unknown:
            raise TrainprofError(
                f"unknown rule {unknown[0]!r} for --fix; runtime fixes: "
                + ", ".join(sorted(catalog.RUNTIME))
            )
        rules = asked or [r for r in self.est if r in catalog.RUNTIME or r in catalog.EDIT_THE_CODE]
        # a rank's share of the CPUs: its workers and threads beside the job's other ranks
        cores = self.meta.cpus_per_rank() or os.cpu_count() or 1
        loaders = self.meta.dataloaders
        workers = loader_cuts.training_workers(loaders) if loaders else None
        evaluation = loader_cuts.evaluation_locations(loader_cuts.cuts(loaders))
        # On a CPU run whose loader has workers, a fix switched between blocks of steps is
        # measured with the workers' batches made ahead during the other side's blocks: the
        # fixed dataloader_starved example's bf16 autocast, switched, +40.1 % [+34.3, +41.2]; in
        # rounds of its own +16.1 % [+9.3, +23.0], its worker making a batch in about 33-38 ms of
        # a 49 ms step. In turns each process's workers stop with it.
        ahead = not self.cuda and bool(workers)
        for rule in rules:
            # A GPU loader whose workers fill the CPUs: the saving is a lighter pipeline's
            cpu_bound = rule == LOADER and self.kind.get(rule) == CPU_BOUND
            if rule in catalog.EDIT_THE_CODE or cpu_bound:
                change = catalog.PIPELINE if cpu_bound else catalog.EDIT_THE_CODE[rule]
                self.edit.append({"rule": rule, "change": change,
                                  "estimated_pct": self._est(rule), "verdict": "edit the code",
                                  "permanent_fix": self.rule_fix.get(rule, "")})
                continue
            info = catalog.RUNTIME[rule]
            if info.needs_cuda and not self.cuda:
                v = Variant(rule, [{"rule": rule, "options": {}}])
                v.skipped = "needs a CUDA device; this run was on the CPU"
                self.by_rule[rule] = [v]
                continue
            options = catalog.variants_for(
                rule, cores, self.cuda, workers, self.meta.torch_threads,
                kind=self.kind.get(rule),
                pinned=bool(loaders) and all(d.pin_memory for d in loaders),
                evaluation=evaluation, channels_last=fix_channels_last(self.meta),
            )
            if rule == LOADER and loaders:
                options = _within_streams(options, loaders)
            self.by_rule[rule] = [
                Variant(_name(rule, o), [{"rule": rule, "options": o}],
                        notes=_stream_notes(o, loaders))
                for o in options
            ]
            if (not self.opts.separate and catalog.switchable(rule, self.cuda)
                    and len(options) == 1 and not ahead):
                self.by_rule[rule][0].block = self.switched_block
            for v in self.by_rule[rule]:
                self._turns_unless_switched(v)

    def _turns_unless_switched(self, v: Variant) -> None:
        """A variant not switched in one process changes the process: in turns beside a
        baseline process (tryfix/turns), unless --separate or the run is a job (a job's ranks
        would each have to stop at the same step for the other job's turn: its rounds run on
        their own; a switched fix is switched at the same step in every rank)."""
        if not self.opts.separate and not v.block and not self.ranks:
            v.turns, v.block = True, self.block

    def _note_load(self, other: float | None, steal: float | None) -> None:
        """A round's load (capture/loadprobe): other processes' CPUs and the host's steal share,
        where known, for tryfix/machine."""
        if other is not None:
            self.others.append(other)
        if steal is not None:
            self.steals.append(steal)

    def _run_other_cpus(self) -> float | None:
        """The CPUs other processes kept busy in the run. A job's ranks recorded before their
        load left out the job (Load.own_tree; torchrun's ranks: before the `torchrun` field)
        counted its other ranks among them, which its rounds leave out (capture/loadprobe):
        not comparable, so not compared."""
        load = self.meta.load
        if load is None:
            return None
        if self.job is not None and self.job.ranks > 1 and load.own_tree is None and not (
                self.job.torchrun and self.meta.torchrun):
            return None
        return load.other_cpus

    def _optimizer(self) -> str | None:
        """The class of the run's first torch.optim optimizer, for the code change."""
        names = [o.cls.rsplit(".", 1)[-1] for o in self.meta.optimizers if o.cls]
        return names[0] if names else None

    def _no_claim(self, rule: str) -> dict[str, str]:
        """{"estimate_note": why} for a rule whose findings claim no saving, else {}."""
        if rule not in self.est or self.est[rule] is not None:
            return {}
        kind = self.kind.get(rule)
        return {"estimate_note": NO_CLAIM.get(kind or "", "not estimated by the diagnosis")}

    def _est(self, rule: str) -> float | None:
        v = self.est.get(rule)
        return None if v is None else round(v, 1)

    def _est_for(self, rule: str, options: dict[str, Any]) -> float | None:
        """The estimate for one option set: the DataLoader model's for a worker count other than
        the suggested one, none for the sweep's thread-only control, else the rule's."""
        if options.get("control"):
            return None
        if rule == LOADER and options.get("num_workers") == 0:
            return None  # the sweep's no-workers variant: no finding estimates that
        v = self.found.for_workers(rule, options)
        return self._est(rule) if v is None else round(v, 1)

    def _suggested_change(self, rule: str) -> str:
        """The change the diagnosis's estimate is for (the DataLoader's suggested count)."""
        n = self.found.suggested_workers()
        opts = next((s["options"] for v in self.by_rule.get(rule, []) for s in v.specs
                     if s["options"].get("num_workers") == n), None)
        return catalog.change_text(rule, opts or {"num_workers": n})

    def _variant_entry(self, rule: str, x: Variant) -> dict[str, Any]:
        """One variant of a sweep in try.json: its change, its estimate (the diagnosis's model
        for that change, where it has one) and what it measured."""
        opts = x.specs[0]["options"]
        est = self._est_for(rule, opts)
        m = self.measured(x)
        spread = self.found.spread_for(rule, opts) if est is not None else None
        out = {"change": catalog.change_text(rule, opts),
               **({"estimated_pct": est} if est is not None else {}),
               **({"estimated_spread_pct": spread} if spread is not None else {}), **(m or {}),
               **({"error": x.error} if x.error else {})}
        if m is not None and est is not None:
            out["estimate_within_target"] = self._checked(rule, est, m, self.split_threads(rule, x))
        return out

    def _checked(
        self, rule: str, est: float | None, m: dict, split: dict | None
    ) -> bool | None:
        """Whether `est` is within target of what it estimates: a worker variant's workers' part
        (`split`, split_threads) where the estimate leaves the thread change out, else the
        variant's whole measured saving."""
        part = split is not None and rule not in self.threads_modelled
        return within_target(est, split["workers_pct"] if part else m["measured_pct"])

    def _variants(self) -> list[Variant]:
        return [v for vs in self.by_rule.values() for v in vs] + (
            [self.combined] if self.combined else [])

    def active(self) -> list[Variant]:
        return [v for vs in self.by_rule.values() for v in vs if not v.skipped and not v.error]

    # ----- running -----------------------------------------------------------------------------
    def execute(self) -> int:
        say = _say
        todo = self.active()
        if not todo:
            say("nothing to measure: no runtime fix applies to this run")
            self.save()
            return 0
        # A script that runs its own profiler runs it in the rounds too (tryfix/outputs).
        off = "trainprof's profiler off" if self.meta.user_traces else "profiler off"
        end = script_end(self.meta)
        short = end is not None and end < self.steps
        upto = f"the script ends after {end}; " if short else ""
        say(f"{len(todo)} variant(s) + baseline, {self.opts.rounds} rounds of "
            f"{'at most ' if short else ''}{self.steps} steps ({upto}the first {WARMUP_STEPS} of "
            f"each not timed), {off}; script output: {self.log}")
        if self.ranks:
            how = ("through torchrun" if self.job.torchrun else
                   "started as the script starts them (Lightning, accelerate, spawn)")
            say(f"each round runs the job again: {self.ranks} ranks on this machine, {how}, a "
                "step timed as its slowest rank's; fixes in every rank, none taking turns")
        switched = [v.name for v in todo if v.block and not v.turns]
        paired = [v.name for v in todo if v.turns]
        if paired:
            shared = [u for u in self.units(todo) if len(u) > 1]
            say(f"run beside a baseline process, taking turns in blocks of {switch.TRANSITION} + "
                f"{self.block} steps (the others stopped meanwhile), each variant's process "
                f"{self.turn_steps} steps: " + ", ".join(paired))
            for u in shared:
                say(f"{u[0].specs[0]['rule']}'s {len(u)} variants share one baseline process "
                    f"(each compared with it in the same seconds), which runs {len(u)} times "
                    "their blocks")
            if not shared and any(len(u) > 1 for u in self._by_rule(todo)):  # each its own
                say(f"the script ends after {end} steps, before a baseline "
                    "process shared by a rule's variants would reach all their blocks: each "
                    "variant runs beside a baseline process of its own")
        if switched:
            say(f"switched off and on in blocks of {switch.TRANSITION} + {self.switched_block} "
                f"steps in "
                f"rounds of {self.switched_steps} steps (both sides in one process"
                f"{', each rank switching at the same step' if self.ranks else ''}): "
                + ", ".join(switched))
        try:
            began = time.monotonic()
            after = (", then the fixes that measured a saving together"
                     if len({v.specs[0]["rule"] for v in todo}) > 1 else "")
            for k in range(self.opts.rounds):
                if k:  # measured, not guessed: the rounds so far took this long each
                    left = (self.opts.rounds - k) * (time.monotonic() - began) / k
                    say(f"{k} of {self.opts.rounds} rounds done; about {_duration(left)} for "
                        f"the rest{after}")
                # Each round starts one place further along: on a machine whose load drifts,
                # a fixed order would give the variants run last in every round a steady edge
                # (or handicap) that the rounds' interval cannot see.
                order = [[self.base], *self.units(todo)]
                shift = k % len(order)
                for unit in order[shift:] + order[:shift]:
                    unit = [v for v in unit if not v.error]
                    if not unit:
                        continue
                    if unit[0].turns:
                        self._turns_round(unit, k)
                    else:
                        self._round(unit[0], k)
                    if self.base.error and not self.base.rounds:
                        say(f"the script fails without any fix: {self.base.error}")
                        self.save()
                        return 1
                    if self.base.error:  # a later baseline round failed: keep the earlier ones
                        say(f"baseline round {k + 1} failed ({self.base.error}); the figures are "
                            f"those of the {len(self.base.rounds)} rounds before it")
                        self.stopped = f"baseline round {k + 1} failed: {self.base.error}"
                        self.save()
                        return 0
                self.save()
            self._combine()
            self.save()
        except KeyboardInterrupt:
            self.interrupted = True
            self.save()
            say(f"interrupted: the rounds done so far are in {self.run / TRY_NAME}")
            return 130
        return 0

    def units(self, todo: list[Variant]) -> list[list[Variant]]:
        """What each round runs, one after the other: the variants of a rule measured in turns,
        on a CPU, beside one baseline process (tryfix/turns: each compared with the baseline in
        the same seconds, and one baseline process instead of one each); any other variant
        alone."""
        units = self._by_rule(todo)
        # A script that ends before a shared baseline process reaches every variant's blocks
        # (the Hugging Face example's 40 steps: the first of three variants got pairs, the
        # others none) measures each beside a baseline process of its own.
        end = script_end(self.meta)
        return [[v] for u in units for v in u] if end is not None and any(
            end < self.shared_steps(len(u)) for u in units if len(u) > 1) else units

    def _by_rule(self, todo: list[Variant]) -> list[list[Variant]]:
        """`units` wherever the script runs long enough: a rule's variants in turns together."""
        units: list[list[Variant]] = []
        shared: dict[str, list[Variant]] = {}
        for v in todo:
            if v.turns and not v.alone and not self.cuda and v.specs:
                rule = v.specs[0]["rule"]
                if rule not in shared:
                    shared[rule] = []
                    units.append(shared[rule])
                shared[rule].append(v)
            else:
                units.append([v])
        return units

    def shared_steps(self, variants: int) -> int:
        """The steps a baseline process shared by `variants` variants runs in a round of turns."""
        sides = turns.schedule(self.turn_cycles, 0, variants)
        return turns.own_steps(turns.own_blocks(sides, 0), self.block, WARMUP_STEPS)

    def _combine(self) -> None:
        best = [b for b in (self.best(r) for r in self.by_rule) if b is not None]
        good = [(v, m) for v, m in best if m["ci_pct"][0] > 0]
        if len(good) < 2:
            self.combined_note = (
                "no fix measured a saving" if not good else "only one fix measured a saving"
            )
            return
        specs = [s for v, _ in good for s in v.specs]
        rules = [s["rule"] for s in specs]
        # A fused optimizer that would take more on channels-last weights than cpu-bf16's fix
        # saves less in the model's own layout: the two together keep the own layout.
        own = self.found.own_layout_together(rules)
        if own:
            specs = [{**s, "options": {**s["options"], "channels_last": False}}
                     if s["rule"] == "cpu-bf16" else s for s in specs]
        self.combined = Variant("combined", specs)
        # Never switched, even where each fix was: switched together, metrics_sync's cpu-bf16
        # and fused SGD measured +11.3 % [+10.1, +14.2], against +15.3 % in turns and +15.5 % in
        # rounds of their own (the run's estimate 16.4 %). Why is not known; the two processes of
        # the turns run each as a user's would.
        self._turns_unless_switched(self.combined)
        _say(f"all fixes together: {', '.join(v.name for v, _ in good)}"
             + (" (cpu-bf16 in the model's own layout: the fused optimizer runs slower on "
                "channels-last weights)" if own else ""))
        base_kept = len(self.base.rounds)
        for k in range(self.opts.rounds):
            if not self.combined.turns:  # in turns, its baseline runs beside it
                self._round(self.base, base_kept + k)
            self._round(self.combined, k)
            self.save()

    def _round(self, v: Variant, k: int) -> None:
        if v.turns:
            self._turns_round([v], k)
            return
        _say(f"round {k + 1}: {v.name}")
        with tempfile.TemporaryDirectory(prefix="trainprof-try-") as tmp:
            result_file = Path(tmp) / "result.json"
            steps = self.switched_steps if v.block else self.steps
            cmd = self.launcher.command(v.specs, steps, result_file)
            if v.block:  # each round starts with the other side: ABBA, then BAAB
                cmd += ["--alternate", str(v.block), "--parity", str(k % 2),
                        "--warmup", str(WARMUP_STEPS)]
            cmd += ["--", *self.meta.argv]
            code = self.launcher.run(cmd, v.name, self._extra_s(v))
            res = read_result(result_file, self.ranks or 1)
        self._note_outputs(res)
        if res is not None:  # the machine's load, whatever the round's end
            self._note_load(res.get("other_cpus"), res.get("steal_share"))
        error, skipped = self._outcome(res, code, v.specs)
        if error or skipped:
            v.error, v.skipped = error, skipped
            return
        assert res is not None
        times, clock = round_times(res)
        self.clocks.add(clock)
        timed = timed_steps(times, res.get("compile_steps") or [], WARMUP_STEPS,
                            res.get("eval_steps") or [])
        if not timed.kept:
            v.error = (f"the script ran {len(times)} steps, not more than the {timed.head} warm-up "
                       "steps" + (" and the recompilations" if timed.recompiles else ""))
            return
        kept = timed.kept
        if v.block:
            off, kept = switch.split(times, res.get("fix_on") or [], WARMUP_STEPS, timed.head,
                                     timed.not_timed(), v.block)
            if not off or not kept:
                v.error = (f"the script ran {len(times)} steps, too few for a block of "
                           f"{v.block} steps with the fix and one without after the warm-up")
                return
            v.switched_off.append(off)
        self._keep(v, kept, timed, len(times), res)

    def _turns_round(self, vs: list[Variant], k: int) -> None:
        """A round of the variants `vs` beside one baseline process, taking turns (tryfix/turns).
        The first round that fails so (processes at once: the memory of each, a port the script
        binds) leaves each variant of a shared round to a baseline process of its own, and a
        variant failing beside its own to rounds of its own, which say whether the fix itself
        fails."""
        from trainprof.capture.loadprobe import LoadProbe

        _say(f"round {k + 1}: {', '.join(v.name for v in vs)}, taking turns with the baseline")
        sides = turns.schedule(self.turn_cycles, k % 2, len(vs))
        load = LoadProbe()  # this process's tree holds them all: their load is not "other"
        with tempfile.TemporaryDirectory(prefix="trainprof-try-") as tmp:
            # each its own folder: a round's outputs/ is beside its result file
            files = [Path(tmp) / f"process-{i}" / "result.json" for i in range(len(vs) + 1)]
            for f in files:
                f.parent.mkdir()
            specs = [[], *(v.specs for v in vs)]
            steps = [turns.own_steps(turns.own_blocks(sides, i), self.block, WARMUP_STEPS)
                     for i in range(len(vs) + 1)]

            def command(i: int, fds: str) -> list[str]:
                return [*self.launcher.command(specs[i], steps[i], files[i]),
                        "--turns", fds, "--turn-block", str(self.block),
                        "--warmup", str(WARMUP_STEPS), "--", *self.meta.argv]

            label = ", ".join(v.name for v in vs)
            names = [f"{label}, the baseline taking turns",
                     *(f"{v.name}, the variant taking turns" for v in vs)]
            deadline = time.monotonic() + (1 + len(vs)) * self.launcher.timeout(
                max(self._extra_s(v) for v in vs))
            codes, ran, why = turns.run_group(self.launcher, command, names, sides, deadline,
                                              Path(tmp))
            results = [read_result(f) for f in files]
        finished = load.finish()
        self._note_load(finished.other_cpus, finished.steal_share())
        for res in results:
            self._note_outputs(res)
        base_error = self._outcome(results[0], codes[0], [])[0]
        timed = []  # each process's step times, and which of them are timed
        for res in results:
            times, clock = round_times(res) if res is not None else ([], "")
            if res is not None:
                self.clocks.add(clock)
            timed.append((times, timed_steps(times, (res or {}).get("compile_steps") or [],
                                             WARMUP_STEPS, (res or {}).get("eval_steps") or [])))
        pairs = turns.split([t for t, _ in timed], ran, WARMUP_STEPS, self.block,
                            [x.not_timed() for _, x in timed])
        for j, v in enumerate(vs, start=1):
            error, skipped = self._outcome(results[j], codes[j], v.specs)
            if skipped and not base_error:
                v.skipped = skipped
                continue
            error = ("the baseline beside it: " + base_error) if base_error else error
            if error:
                if v.rounds:
                    v.error = error
                elif len(vs) > 1:
                    v.alone = True
                    v.notes = sorted({*v.notes, "measured beside a baseline process of its own: "
                                      f"beside one shared with the rule's other variants, it "
                                      f"failed ({error})"})
                    self._turns_round([v], k)
                else:
                    v.turns, v.block = False, 0
                    v.notes = sorted({*v.notes, f"measured in rounds of its own: run beside the "
                                      f"baseline, taking turns, it failed ({error})"})
                    self._round(v, k)
                continue
            off, kept = pairs[j - 1]
            if not off or not kept:
                reason = why.get(j) or why.get(0)  # its own process's, or the baseline's
                ended = f" ({reason})" if reason else ""
                v.error = (f"the script ran {len(timed[0][0])} and {len(timed[j][0])} steps"
                           f"{ended}: too few for a block of {self.block} steps in each process "
                           "after the warm-up")
                continue
            v.switched_off.append(off)
            v.beside = [catalog.change_text(x.specs[0]["rule"], x.specs[0]["options"])
                        for x in vs if x is not v]
            self._keep(v, kept, timed[j][1], len(timed[j][0]), results[j])

    def _keep(self, v: Variant, kept: list[float], timed: Timed, ran: int, res: dict) -> None:
        v.rounds.append(kept)
        v.discarded.append(timed.head)
        v.recompiles.append(timed.recompiles)
        v.evals.append(timed.evals)
        v.ran.append(ran)
        v.refs += [t for step, t in res.get("phase_ref_s") or [] if step >= timed.head]
        v.notes = sorted(set(v.notes) | set(res.get("notes") or []))

    def _note_outputs(self, res: dict | None) -> None:
        """What the round's script did with its profiler and its files (tryfix/outputs)."""
        for key, seen in self.script_profiler.items():
            seen.update((res or {}).get("script_profiler", {}).get(key) or [])
        self.redirected.update((res or {}).get("redirected") or [])

    def _outcome(self, res: dict | None, code: int, specs: list[dict]
                 ) -> tuple[str | None, str | None]:
        """(why the round failed, why its fixes did not apply), each None if not."""
        if res is None:
            why = "it ran past its time limit" if code == -signal.SIGKILL else f"exit code {code}"
            return f"the round ended without a result ({why}; see {self.log})", None
        failed = res.get("failed") or {}
        if failed:
            return "; ".join(failed.values()), None
        if res.get("exit_code", 0) != 0:
            where = f" in rank {res['failed_rank']}" if res.get("failed_rank") is not None else ""
            return (f"the script failed with this fix (exit {res['exit_code']}{where}): "
                    + (res.get("error") or "see " + str(self.log))), None
        skipped = res.get("skipped") or {}
        if specs and skipped and len(skipped) == len(specs):
            return None, "; ".join(skipped.values())
        return None, None

    @staticmethod
    def _extra_s(v: Variant) -> float:
        return COMPILE_TIME_S if any(s["rule"] == "launch-bound" for s in v.specs) else 0.0

    # ----- results -----------------------------------------------------------------------------
    def _base_for(self, v: Variant) -> list[list[float]]:
        """The baseline rounds `v` ran beside (the combined variant: the last ones; a switched
        variant: its own rounds' steps without the fix)."""
        if v.block:
            return v.switched_off
        base = self.base.rounds
        return base[len(base) - len(v.rounds):] if v is self.combined else base

    def measured(self, v: Variant) -> dict | None:
        """Measured saving of `v` against the baseline rounds it ran beside."""
        base = self._base_for(v)
        n = min(len(base), len(v.rounds))
        if not n:
            return None
        block = v.block or BLOCK_STEPS
        measure = switched_saving if v.block else saving
        m, lo, hi = measure(base[:n], v.rounds[:n], block)
        out = {"measured_pct": round(m, 1), "ci_pct": [round(lo, 1), round(hi, 1)],
               "rounds": n, "median_ms": round(1000 * pace(v.rounds[:n], block), 3),
               "step_times_ms": [[round(1000 * t, 3) for t in r] for r in v.rounds[:n]]}
        if v.block:
            out["turns" if v.turns else "switched"] = {
                "block_steps": v.block,
                "transition_steps": switch.TRANSITION,
                "without_median_ms": round(1000 * pace(base[:n], block), 3),
                "without_step_times_ms": [[round(1000 * t, 3) for t in r] for r in base[:n]],
                **({"baseline_shared_with": v.beside} if v.turns and v.beside else {}),
            }
        return out

    def best(self, rule: str) -> tuple[Variant, dict] | None:
        scored = [(v, self.measured(v)) for v in self.by_rule.get(rule, [])
                  if not any(s["options"].get("control") for s in v.specs)]
        scored = [(v, m) for v, m in scored if m is not None]
        return max(scored, key=lambda vm: vm[1]["measured_pct"]) if scored else None

    def split_threads(self, rule: str, v: Variant) -> dict | None:
        """A worker variant that also changed the intra-op threads, beside the control that only
        changed them: its saving split into the threads' part (the control vs the baseline) and
        the workers' part (the variant vs the control, in points of the baseline step), which is
        what the estimate models. None without such a control."""
        opts = v.specs[0]["options"] if v.specs else {}
        if rule != "dataloader-starvation" or not opts.get("threads"):
            return None
        ctl = next((x for x in self.by_rule.get(rule, []) if x.specs
                    and x.specs[0]["options"].get("control")
                    and x.specs[0]["options"].get("threads") == opts["threads"]), None)
        if ctl is None:
            return None
        mc, mv = self.measured(ctl), self.measured(v)
        n = min(len(ctl.rounds), len(v.rounds))
        if mc is None or mv is None or not n:
            return None
        if v.turns and ctl.turns:
            # Each beside a baseline: the points between the two savings are the workers' part
            # (1 - v/b - (1 - c/b) = (c - v)/b), its interval the two intervals' half-widths
            # combined as independent (wider than need be where they share a baseline process).
            w = mv["measured_pct"] - mc["measured_pct"]
            (vlo, vhi), (clo, chi) = mv["ci_pct"], mc["ci_pct"]
            lo = w - math.hypot(mv["measured_pct"] - vlo, chi - mc["measured_pct"])
            hi = w + math.hypot(vhi - mv["measured_pct"], mc["measured_pct"] - clo)
            return {"threads_only_pct": mc["measured_pct"], "threads_only_ci_pct": mc["ci_pct"],
                    "workers_pct": round(w, 1), "workers_ci_pct": [round(lo, 1), round(hi, 1)]}
        base = self.base.rounds[:n]
        c_med, b_med = pace(ctl.rounds[:n]), pace(base)
        if not b_med:
            return None
        scale = c_med / b_med  # points of the control step -> points of the baseline step
        w, lo, hi = saving(ctl.rounds[:n], v.rounds[:n])
        return {"threads_only_pct": mc["measured_pct"], "threads_only_ci_pct": mc["ci_pct"],
                "workers_pct": round(w * scale, 1),
                "workers_ci_pct": [round(lo * scale, 1), round(hi * scale, 1)]}

    def combined_entry(self) -> dict[str, Any] | None:
        """try.json's `combined`: the fixes together, estimated and measured; or why not run."""
        if self.combined is None:
            return {"rules": [], "note": self.combined_note} if self.combined_note else None
        m = self.measured(self.combined)
        est, basis = self.found.together(self.combined.specs)
        rules = [s["rule"] for s in self.combined.specs]
        less = self.found.cost_between(rules) if est is not None else 0.0
        # cpu-bf16's fix kept in the model's own layout there, where alone it makes it
        # channels-last (as _combine ran it)
        own = self.found.own_layout_together(rules)
        out = {"rules": rules,
               "estimated_pct": None if est is None else round(est, 1),
               **({"estimate_basis": basis} if est is not None else {}),
               **({"estimate_less_pct": less} if less > 0 else {}),
               **({"cpu_bf16_own_layout": True} if own else {})}
        over = self.found.idle_over(rules) if est is not None and basis == SUM else 0.0
        if over > 0:
            # the fixes of the host's side held to the GPU idle of the unprofiled step
            out.update(estimate_idle_over_pct=over, gpu_idle_bound_pct=self.found.idle_bound)
        if m is not None:
            out.update(m)
            if est is not None:
                out["estimate_within_target"] = within_target(est, m["measured_pct"])
        if self.combined.error:
            out["error"] = self.combined.error
        return out

    def document(self) -> dict[str, Any]:
        fixes = []
        for rule, vs in self.by_rule.items():
            pick = self.best(rule)
            v, m = pick if pick is not None else (vs[0], None)
            options = v.specs[0]["options"] if v.specs else {}
            # The estimate for the change measured: the diagnosis's for its suggestion, its
            # model's for another worker count of the sweep (the suggestion's then beside it).
            est, suggested = self._est_for(rule, options), self._est(rule)
            entry: dict[str, Any] = {
                "rule": rule,
                "change": catalog.change_text(rule, options),
                "estimated_pct": est,
                **self._no_claim(rule),
                **({"estimated_spread_pct": spread}
                   if (spread := self.found.spread_for(rule, options)) is not None else {}),
                **({"suggested_change": self._suggested_change(rule),
                    "suggested_estimated_pct": suggested} if est != suggested else {}),
                "measured_pct": None,
                "ci_pct": None,
                "verdict": None,
                "permanent_fix": catalog.permanent_text(rule, options, self._optimizer()),
            }
            if m is not None:
                entry.update(measured_pct=m["measured_pct"], ci_pct=m["ci_pct"],
                             rounds=m["rounds"], median_ms=m["median_ms"],
                             step_times_ms=m["step_times_ms"],
                             **{k: m[k] for k in ("switched", "turns") if k in m},
                             verdict=verdict(est, m["measured_pct"], *m["ci_pct"]))
                lo, hi = m["ci_pct"]
                if entry["verdict"] == "none" and est and lo <= est <= hi:
                    # The rounds cannot tell the estimate from 0: how many could, here.
                    n = m["rounds"]
                    k = (switched_rounds_to_tell(est, n, lo, hi) if v.block
                         else rounds_to_tell(est, per_round(self._base_for(v)[:n], v.rounds[:n])))
                    if k is not None:
                        entry["rounds_to_tell"] = k
                        if k > MAX_ROUNDS:
                            entry["rounds_to_tell_beyond"] = True
                split = self.split_threads(rule, v)
                entry["estimate_within_target"] = self._checked(rule, est, m, split)
                if split is not None:
                    entry.update(split)
                    entry["estimate_includes_threads"] = rule in self.threads_modelled
                if v.error:  # a later round failed: the figures are those of the earlier ones
                    entry["error"] = v.error
            elif v.skipped:
                entry["verdict"] = "not applicable"
                entry["reason"] = v.skipped
            elif v.error:
                entry["verdict"] = "error"
                entry["error"] = v.error
            if v.notes:
                entry["notes"] = v.notes
            if any(d != WARMUP_STEPS for d in v.discarded):  # torch.compile: its steps too
                entry["warmup_steps_discarded"] = max(v.discarded)
            if any(v.recompiles):  # recompilations after the first: their steps not timed
                entry["recompile_steps"] = v.recompiles
            if any(v.evals):  # evaluation passes: their steps not timed
                entry["eval_steps"] = v.evals
            if len(vs) > 1:  # a sweep: every variant's figure, the best one above
                entry["variants"] = [self._variant_entry(rule, x) for x in vs]
            fixes.append(entry)
        fixes += self.edit
        combined = self.combined_entry()
        base_rounds = self.base.rounds
        return {
            "schema": SCHEMA,
            "run": str(self.run.resolve()),
            "command": self.meta.argv,
            "cwd": self.meta.cwd or None,
            # a job's rounds: the job again, each step its slowest rank's (spawn.py)
            "ranks": self.ranks,
            **({"ranks_started_by": "torchrun" if self.job.torchrun else "script"}
               if self.job is not None else {}),
            "steps_per_round": self.steps,
            # the rounds that switch a fix off and on run both sides: about twice the steps
            **({"switched_steps_per_round": self.switched_steps}
               if any(v.block and not v.turns for v in self._variants()) else {}),
            # a round of turns runs a process for each variant, this many steps, beside a
            # baseline process that runs as many steps for each variant beside it
            **({"turns_steps_per_process": self.turn_steps}
               if any(v.turns for v in self._variants()) else {}),
            "warmup_steps_discarded": WARMUP_STEPS,
            "block_steps": BLOCK_STEPS,
            "profiled": False,
            "step_clock": "/".join(sorted(self.clocks)) or None,
            "interrupted": self.interrupted,
            "stopped_early": self.stopped,
            "estimates_note": self.est_note,
            "baseline": {
                "rounds": len(base_rounds),
                "median_ms": round(1000 * pace(base_rounds), 3) if base_rounds else None,
                "step_times_ms": [[round(1000 * t, 3) for t in r] for r in base_rounds],
                "steps_run": self.base.ran,
                "eval_steps": self.base.evals if any(self.base.evals) else None,
                "error": self.base.error,
            },
            "run_step_ms": round(self.basis[0], 3) if self.basis else None,
            "run_step_basis": self.basis[1] if self.basis else None,
            "machine": machine.compare(
                [t for _, t in self.meta.phase_ref_s], self.base.refs,
                self._run_other_cpus(),
                self.others,
                self.meta.machine_cpus(),
                self.meta.load.steal_share() if self.meta.load else None,
                self.steals,
            ),
            "script_profiler": (
                {k: sorted(v) for k, v in self.script_profiler.items()}
                if any(self.script_profiler.values()) else None
            ),
            "redirected": sorted(self.redirected),
            "sources_changed": self.sources_changed,
            "fixes": fixes,
            "combined": combined,
            # earlier tries' results kept in the run folder (runmeta.keep_earlier_try)
            "earlier": earlier_tries(self.run),
        }

    def save(self) -> None:
        doc = self.document()
        write_atomic(self.run / TRY_NAME, json.dumps(doc, indent=2).encode("utf-8"))


def round_times(res: dict) -> tuple[list[float], str]:
    """A round's step times and their clock: the GPU's (CUDA events at the step boundaries,
    capture/gpusteps.py) when known for every step but the first, which warm-up drops anyway;
    else the host's, which follow the GPU only where the loop waits for it."""
    host = res.get("step_times_s") or []
    gpu = res.get("gpu_step_times_s") or []
    if len(gpu) == len(host) > 1 and all(t is not None for t in gpu[1:]):
        return [host[0], *gpu[1:]], "gpu"
    return host, "host"


def _name(rule: str, options: dict) -> str:
    if not options:
        return rule
    def shown(v: Any) -> str:  # lists of file:line places by their file's name
        return loader_cuts.place_names(v, "+") if isinstance(v, list) else str(v)

    return f"{rule}[" + ",".join(f"{k}={shown(v)}" for k, v in options.items()) + "]"


def _duration(seconds: float) -> str:
    """A duration to the nearest minute (seconds under two minutes)."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _say(text: str) -> None:
    print(f"trainprof: {text}", file=sys.stderr, flush=True)


def try_command(opts: TryOptions) -> int:
    """Measure the fixes; print the table; write try.json and refresh the run's reports."""
    if opts.rounds < 1:
        raise TrainprofError("--rounds takes a number of at least 1")
    if opts.steps is not None and opts.steps <= WARMUP_STEPS:
        raise TrainprofError(f"--steps must be more than the {WARMUP_STEPS} warm-up steps")
    meta = load_run(opts.run)
    trial = Trial(opts, meta)
    trial.plan()
    if trial.sources_changed:
        _say(f"{', '.join(trial.sources_changed)} changed since the run: the rounds run the "
             "files as they are now, the estimates are the run's diagnosis of them as they ran")
    kept = keep_earlier_try(Path(opts.run))
    if kept is not None:
        _say(f"the results of the earlier try on this run are kept as {kept}")
    # try.log gathers every try's rounds: each try's begin where it starts
    with open(trial.log, "a") as log:
        fixes = ", ".join(opts.fixes) or "every fix"
        rounds = f"{opts.rounds} round" + ("s" if opts.rounds != 1 else "")
        log.write(f"\n##### trainprof try ({fixes}; {rounds}) at "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    code = trial.execute()
    doc = trial.document()
    from trainprof.report.tryout import render_try_text

    sys.stdout.write(render_try_text(doc))
    sys.stdout.flush()
    _refresh_reports(Path(opts.run), meta)
    return code


def _refresh_reports(run: Path, meta: RunMeta) -> None:
    """report.html and the TensorBoard files again, now with the measurements."""
    try:
        from trainprof.diagnose import diagnose_path
        from trainprof.report.run_reports import write_run_reports

        if any(run.glob("*.pt.trace.json*")):
            write_run_reports(run, diagnose_path(run), meta)
    except Exception as err:  # noqa: BLE001 - try.json is written; the reports are extras
        _say(f"could not refresh the reports in {run}: {type(err).__name__}: {err}")
