"""User-facing errors: the CLI prints their message on one line and exits with `exit_code`."""


def one_line(err: BaseException, last: bool = False, width: int = 200) -> str:
    """`Type: message` on one line, for a probe's "skipped" reason: the message's first line, or
    its last with `last` (a DataLoader worker's error re-raised in the main process ends with
    the original one), cut at `width` characters."""
    text = str(err).strip().splitlines()
    if not text:
        return type(err).__name__
    return f"{type(err).__name__}: {text[-1 if last else 0][:width]}"


class TrainprofError(Exception):
    """A problem with the user's input that deserves one clear line, not a traceback."""

    exit_code = 2
