"""trainprof's start-up hook (see trainprof/capture/children.py).

`trainprof run` puts this folder first on PYTHONPATH for the processes its script starts, so
Python imports this file at start-up in each of them. It runs the sitecustomize it hides (a
distribution's or a virtualenv's) as Python would have, then lets trainprof.capture.child
profile the process when it is a rank of the script's job (in a `trainprof try` round:
trainprof.tryfix.ranks runs it as a round). It never raises: a failure here leaves the process
as it would have been.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain() -> None:
    """Run the sitecustomize this one hides."""
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # what site prints for a failing sitecustomize
        print("Error in sitecustomize; set PYTHONVERBOSE for traceback:", file=sys.stderr)
        print(f"{type(err).__name__}: {err}", file=sys.stderr)


# Which side set the hook up: `trainprof run` (profile the ranks) or a `trainprof try` round
# (run the ranks as rounds too); each module's start() decides whether this process is a rank.
_HOOKS = (
    ("TRAINPROF_SUBPROCESS", "trainprof.capture.child"),
    ("TRAINPROF_TRY_SUBPROCESS", "trainprof.tryfix.ranks"),
)


def _start() -> None:
    name = next((module for var, module in _HOOKS if os.environ.get(var)), None)
    if name is None:
        return
    # The trainprof that set the hook up: the package this folder belongs to.
    root = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))
    sys.path.insert(0, root)
    try:
        import importlib

        start = importlib.import_module(name).start
    except Exception:
        return
    finally:
        if sys.path[:1] == [root]:
            del sys.path[0]
    start()


try:
    # Out of sys.path: the script sees the path it would have had (PYTHONPATH keeps the folder
    # for the processes it starts).
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    _chain()
except Exception:
    pass
try:
    _start()
except Exception:
    pass
