"""`trainprof run notebook.ipynb`: the notebook's code cells, run in order as one script would
be, in one `__main__` namespace. IPython-only syntax cannot run outside IPython: cell magics
(`%%time`, `%%trainprof`) skip their cell and line magics and shell lines (`%pip`, `!ls`)
are left out, each with a note. Each cell is compiled under the name `<notebook>#cell<N>`,
so tracebacks and findings point at the cell and the line in it.
"""

from __future__ import annotations

import json
import linecache
import re
import sys
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

from trainprof.errors import TrainprofError

_IPYTHON_LINE = re.compile(r"^(\s*)([%!].*)$")


@dataclass
class Cell:
    number: int  # 1-based among the notebook's code cells, as Jupyter counts a fresh run
    filename: str
    source: str


def is_notebook(path: str | Path) -> bool:
    return str(path).endswith(".ipynb")


def _sources(path: Path) -> list[str]:
    """Every code cell's source: with nbformat (any notebook version) when installed, else the
    nbformat 4 JSON read directly."""
    try:
        import nbformat
    except ImportError:
        nbformat = None
    try:
        if nbformat is not None:
            with warnings.catch_warnings():
                # Cells without ids (notebooks older than nbformat 4.5): nothing to the cells'
                # code, and printed once per read (the run reads the notebook twice)
                warnings.filterwarnings("ignore", message="Cell is missing an id field")
                nb = nbformat.read(str(path), as_version=4)
            return [c.source for c in nb.cells if c.cell_type == "code"]
        doc = json.loads(path.read_text(encoding="utf-8"))
        cells = doc["cells"]
        return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                for c in cells if c.get("cell_type") == "code"]  # fmt: skip
    except OSError as err:
        raise TrainprofError(f"cannot read {path}: {err.strerror or err}") from None
    except Exception as err:  # not JSON, not a notebook
        raise TrainprofError(
            f"{path} is not a Jupyter notebook ({type(err).__name__}: {str(err)[:120]})"
        ) from None


def read_cells(path: str | Path) -> tuple[list[Cell], list[str]]:
    """The code cells to run, and a note for each thing left out."""
    path = Path(path)
    cells, notes = [], []
    for n, source in enumerate(_sources(path), 1):
        first = source.lstrip().split("\n", 1)[0]
        if first.startswith("%%"):
            magic = first.split()[0]
            why = (
                "`trainprof run` profiles the whole notebook already"
                if magic == "%%trainprof"
                else "a cell magic needs IPython"
            )
            notes.append(f"notebook cell {n} skipped ({magic}: {why})")
            continue
        lines = source.split("\n")
        for i, line in enumerate(lines):
            m = _IPYTHON_LINE.match(line)
            if m:  # `pass` keeps the line numbers, and a block whose only line it was
                lines[i] = f"{m.group(1)}pass"
                notes.append(f"notebook cell {n} line {i + 1} left out (IPython): {m.group(2)}")
        cells.append(Cell(n, f"{path.resolve()}#cell{n}", "\n".join(lines)))
    if not cells:
        raise TrainprofError(f"{path} has no code cells to run")
    return cells, notes


def run_notebook(path: str) -> None:
    """Run the code cells in order in a fresh `__main__`, as runpy runs a script (saying first
    what is left out); the first exception ends the run, as in `jupyter nbconvert --execute`."""
    cells, notes = read_cells(path)
    for note in notes:
        print(f"trainprof: note: {note}", file=sys.stderr, flush=True)
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__dict__["display"] = _display  # the one IPython name notebooks use everywhere
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        for cell in cells:
            # Tracebacks show the cell's lines (linecache cannot read `nb.ipynb#cell3`).
            lines = cell.source.splitlines(keepends=True)
            linecache.cache[cell.filename] = (len(cell.source), None, lines, cell.filename)
            exec(compile(cell.source, cell.filename, "exec"), main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _display(*objs: object, **kwargs: object) -> None:
    for obj in objs:
        print(repr(obj))
