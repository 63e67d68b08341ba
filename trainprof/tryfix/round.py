"""One round of `trainprof try`: run the script once, profiler off, with some fixes applied.

    python -m trainprof.tryfix.round --fixes JSON --max-steps N --result FILE -- SCRIPT ARGS
    python -m trainprof.tryfix.round --fixes JSON --max-steps N --result FILE -- -m MODULE ARGS
    ... --alternate BLOCK --parity P --warmup W ...: the fixes switched off and on in blocks of
    steps (tryfix/switch), every step's side in the result (`fix_on`)
    ... --turns GO_FD,DONE_FD --turn-block BLOCK --warmup W ...: one side of a round of turns
    (tryfix/turns): report after the warm-up and after each block, and wait for the word

The script runs in this process like `trainprof run` runs it (capture/launch.py run_target), with
only the step timer (capture/stepper.py, without a profiler, and the probes it needs to find
steps and the evaluation passes between them, capture/evaluation), the fix patches and, on a
CPU, the run's reference timed at the step boundaries (capture/phaseref: how fast the machine
ran, for tryfix/machine), and the CPUs other processes kept busy meanwhile (capture/loadprobe).
The script's own profiler runs as in the run, writing no file, and the script's checkpoints, the
frameworks' logs (tryfix/outputs) and what it writes through Python's file calls
(tryfix/userfiles) go to outputs/ beside the result file. The result file gets every step's wall
time, the steps that evaluated, those references, how the script ended, what the fixes did and
what the rounds did not write where the run did (a rank of a job's round: a result file of its
own, spawn.rank_result). The exit code is the script's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: python -m trainprof.tryfix.round [options] -- SCRIPT ARGS")
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="trainprof.tryfix.round")
    p.add_argument("--fixes", default="[]", help="JSON list of {rule, options}")
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--result", type=Path, required=True)
    p.add_argument("--alternate", type=int, default=0, help="timed steps per block (0: off)")
    p.add_argument("--parity", type=int, default=0, help="odd: the fix on in the first block")
    p.add_argument("--warmup", type=int, default=0, help="steps before the first block")
    p.add_argument("--turns", default="", help="GO_FD,DONE_FD: take turns (tryfix/turns)")
    p.add_argument("--turn-block", type=int, default=0, help="timed steps per block of turns")
    p.add_argument("--rank", type=int, default=None, help="this process's rank in a job")
    p.add_argument("--ranks-hook", action="store_true",
                   help="the ranks the script starts run as rounds too (tryfix/ranks)")
    return p.parse_args(argv[:cut]), argv[cut + 1 :]


def main(argv: list[str] | None = None, call: Callable[[], object] | None = None) -> int:
    """The round; its exit code. `call`: a function of the script to run instead of the script
    (a rank torch.multiprocessing.spawn started: tryfix/ranks), the command then naming the
    script it belongs to."""
    argv = list(sys.argv[1:] if argv is None else argv)
    opts, command = _parse(argv)
    from trainprof.tryfix.spawn import DUMP_SIGNAL

    if DUMP_SIGNAL is not None:  # past its time limit, the round says where it hung
        faulthandler.register(DUMP_SIGNAL, all_threads=True)
    from trainprof.capture.launch import resolve_target, run_target, running, sigterm_guard
    from trainprof.capture.loadprobe import LoadProbe
    from trainprof.capture.patching import Patches
    from trainprof.capture.phaseref import PhaseRef, cpu_run
    from trainprof.capture.probes import install_probes
    from trainprof.capture.runner import env_rank
    from trainprof.capture.state import S
    from trainprof.capture.stepper import Stepper
    from trainprof.capture.userframe import UserCode
    from trainprof.errors import TrainprofError
    from trainprof.tryfix import apiblock
    from trainprof.tryfix.apply import Applied, install
    from trainprof.tryfix.outputs import hold_profiler_files, redirect_records
    from trainprof.tryfix.spawn import rank_result
    from trainprof.tryfix.switch import Alternation, Switch
    from trainprof.tryfix.turns import Turn
    from trainprof.tryfix.userfiles import keep_user_files

    try:
        if command and command[0] == "-m":
            target = resolve_target(None, command[1], command[2:])
        else:
            target = resolve_target(command[0] if command else None, None, command[1:])
    except TrainprofError as err:
        print(f"trainprof: error: {err}", file=sys.stderr)
        return 2
    # A rank of a job's round writes a result file of its own: torchrun's RANK, read before the
    # script can change the variables, or --rank for one the script started (tryfix/ranks; no
    # RANK under Lightning).
    rank = opts.rank if opts.rank is not None else (env_rank() or 0)
    # The ranks the script starts (Lightning's ddp) run as rounds with these options too.
    ranks_hook = None
    if opts.ranks_hook:
        from trainprof.tryfix.ranks import hook

        ranks_hook = hook([a for a in argv[: argv.index("--")] if a != "--ranks-hook"], command)
    specs = json.loads(opts.fixes)
    patches = Patches()
    # Where the script's records go stays patched until this process exits: a script's atexit
    # handler (a summary written at exit) runs after the round; this process is the round's own.
    records = Patches()
    stepper = Stepper(None)
    stepper.profiling = False  # the step timer only: no profiler in a round
    stepper.max_steps = opts.max_steps
    # The machine's speed at the step boundaries, as the run timed it (tryfix/machine).
    phase = PhaseRef(lambda: True, cpu_run, lambda: len(stepper.step_times))
    stepper.on_step = phase.after_step
    switch = Switch()
    alternation = None
    if opts.alternate > 0:
        alternation = Alternation(switch, lambda: len(stepper.step_times), opts.warmup,
                                  opts.alternate, opts.parity)

        def on_step() -> None:
            phase.after_step()
            alternation.after_step()

        stepper.on_step = on_step
    elif opts.turns:
        go_fd, done_fd = (int(x) for x in opts.turns.split(","))
        turn = Turn(go_fd, done_fd, lambda: len(stepper.step_times), opts.warmup,
                    opts.turn_block)

        def on_turn() -> None:
            phase.after_step()
            turn.after_step()

        stepper.on_step = on_turn
    applied = Applied()
    applied.step_of = lambda: len(stepper.step_times)
    error = None
    load: LoadProbe | None = None
    with sigterm_guard():
        try:
            stepper.install(patches)
            held = hold_profiler_files(records)  # the script's own profiler writes nothing
            where = redirect_records(records, str(opts.result.parent / "outputs"), held)
            # ... and what it writes through open(), os.replace... (not this round's result file)
            keep_user_files(records, where, leave=[str(opts.result.parent)])
            # The probes, the evaluation passes included (their steps are not timed: measure.py).
            user = UserCode(target.user_roots)
            install_probes(patches, stepper, user)
            apiblock.install(patches)  # the script's trainprof.profile() blocks: unprofiled
            install(specs, patches, applied, switch, user)
            S.reset()
            S.enabled = True
            load = LoadProbe()  # other processes' CPU use while the script runs (tryfix/machine)
            with ranks_hook if ranks_hook is not None else contextlib.nullcontext():
                if call is not None:
                    outcome = run_target(dataclasses.replace(target, call=call))
                else:
                    with running(target) as run:
                        exec(run.code, run.namespace)  # from this frame, as `run` does
                    assert run.outcome is not None
                    outcome = run.outcome
        finally:
            S.enabled = False
            steps = stepper.finish()
            if ranks_hook is not None:  # they outlive this script: their results come first
                ranks_hook.wait(lambda line: print(f"trainprof try: {line}", file=sys.stderr))
            finished = load.finish() if load is not None else None
            patches.restore()
    if outcome.message:
        sys.stderr.write(outcome.message)
        error = outcome.message.strip().splitlines()[-1] if outcome.message.strip() else None
    result = {
        "step_times_s": [round(t, 6) for t in steps.step_times],
        "gpu_step_times_s": [None if t is None else round(t, 6) for t in steps.gpu_step_times],
        "step_source": steps.source,
        "eval_steps": steps.eval_steps,
        "exit_code": outcome.exit_code,
        "status": outcome.status,
        "error": error,
        "stopped_by_max_steps": bool(outcome.note),
        "notes": applied.notes,
        "skipped": applied.skipped,
        "failed": applied.failed,
        "compile_steps": applied.compile_steps,
        "pid": os.getpid(),
        "ended_at": time.time(),  # a job's first rank to fail ended first (spawn.merge_ranks)
        "phase_ref_s": phase.times,
        # CPUs other processes kept busy on average, and the hypervisor's steal (runmeta.Load)
        "other_cpus": finished.other_cpus if finished is not None else None,
        "steal_share": finished.steal_share() if finished is not None else None,
        # with --alternate: whether the fixes were on in each step (tryfix/switch)
        "fix_on": alternation.sides[: len(steps.step_times)] if alternation else None,
        **held.result(),
    }
    mine = rank_result(opts.result, rank)
    if ranks_hook is not None and not steps.step_times and mine.exists():
        # A launcher the script ran (accelerate launch): its rank 0 wrote the round's result.
        return outcome.exit_code
    mine.write_text(json.dumps(result))
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
