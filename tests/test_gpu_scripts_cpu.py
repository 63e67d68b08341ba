"""The GPU acceptance scripts (tests/gpu/scripts) run their own CPU smoke commands, the
`DEVICE=cpu python SCRIPT ...` lines of their docstrings, so a broken script is caught here, on
CPU, before a rare GPU machine's time is spent on it (the suite itself needs CUDA)."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parent / "gpu" / "scripts"
_SMOKE = re.compile(r"^\s*DEVICE=cpu python (?P<script>\S+\.py)(?P<args>[^#\n]*)", re.M)


def _smoke_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in sorted(SCRIPTS.glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        found += [(m["script"], shlex.split(m["args"])) for m in _SMOKE.finditer(doc)]
    return found


def test_every_script_has_a_smoke_command() -> None:
    named = {script for script, _ in _smoke_commands()}
    # ddp_two.py needs two processes under torchrun; the rest run alone.
    assert named >= {p.name for p in SCRIPTS.glob("*.py")} - {"ddp_two.py"}, named


@pytest.mark.parametrize(("script", "args"), _smoke_commands(), ids=lambda v: str(v))
def test_smoke_command_runs_on_cpu(tmp_path: Path, script: str, args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args], cwd=tmp_path, capture_output=True,
        text=True, timeout=240, env={**os.environ, "DEVICE": "cpu"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
