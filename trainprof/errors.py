"""User-facing errors: the CLI prints their message on one line and exits with `exit_code`."""


class TrainprofError(Exception):
    """A problem with the user's input that deserves one clear line, not a traceback."""

    exit_code = 2
