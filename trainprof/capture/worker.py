"""One rank of a torchrun job under the capture engine: torchrun's program for `trainprof run`.

    python -m trainprof.capture.worker [trainprof run options] SCRIPT [ARGS...]

takes the options of `trainprof run` (not the torchrun ones). `trainprof run --nproc-per-node N`
launches it on every rank through torchrun; it can be torchrun's program directly, where a
cluster already runs torchrun (or an srun wrapper around it):

    torchrun --nproc-per-node 8 -m trainprof.capture.worker --out runs/job1 train.py --lr 0.1
    trainprof diagnose runs/job1        # once every rank has finished

Every rank writes rank<R>.*.pt.trace.json.gz and trainprof.rank<R>.json into the --out folder
(without --out: runs/<script>-<torchrun's rendezvous id>). No rank diagnoses: rank 0 may end
before the others.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    import typer

    from trainprof.capture.command import RUN_CONTEXT, run

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command(context_settings=RUN_CONTEXT)(run)
    command = typer.main.get_command(app)  # one command: the app is `run` itself
    try:
        command.main(sys.argv[1:] if argv is None else argv, "python -m trainprof.capture.worker")
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
