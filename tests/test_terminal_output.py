"""Terminal output: plain text when piped (no ANSI escapes), no colour under NO_COLOR on a
terminal, and `--json` byte-stable across runs and hash seeds."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

from conftest import trace_path

TRAINPROF = str(Path(sys.executable).with_name("trainprof"))
MANY = "HolisticTraceAnalysis/trace_filter/sampled_rank-0.json.gz"  # several findings
ANSI = re.compile(rb"\x1b\[")
# SGR parameters that set a colour: 30-37/39, 40-47/49, 90-97, 100-107, 38;.. and 48;..
COLOUR = re.compile(rb"\x1b\[(?:[0-9;]*;)?(?:3[0-9]|4[0-9]|9[0-7]|10[0-7])(?:;[0-9;]*)?m")


def _env(**extra: str) -> dict[str, str]:
    drop = ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "TERM": "xterm-256color", "COLUMNS": "120", **extra}


def _on_a_tty(args: list[str], env: dict[str, str]) -> bytes:
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=60) == 0, out[-2000:]
    return out


def test_piped_output_has_no_ansi_escapes():
    for env in (_env(), _env(NO_COLOR="1")):
        r = subprocess.run([TRAINPROF, "diagnose", str(trace_path(MANY))], capture_output=True,
                           env=env, check=True)
        assert not ANSI.search(r.stdout)
        assert "finding and evidence" in r.stdout.decode()
        title, *rest = r.stdout.decode().splitlines()
        assert title.startswith(str(trace_path(MANY)))  # a path is never broken
        assert max(len(line) for line in rest) <= 100


def test_no_color_on_a_terminal():
    args = [TRAINPROF, "diagnose", str(trace_path(MANY))]
    coloured = _on_a_tty(args, _env())
    assert COLOUR.search(coloured)  # the check below can fail: a terminal gets colours
    plain = _on_a_tty(args, _env(NO_COLOR="1"))
    # NO_COLOR (no-color.org) removes colour; rich keeps bold/dim, which are not colours.
    assert not COLOUR.search(plain)
    assert b"finding and evidence" in plain


def test_json_is_byte_stable():
    outs = [
        subprocess.run([TRAINPROF, "diagnose", str(trace_path(MANY)), "--json"],
                       capture_output=True, env=_env(PYTHONHASHSEED=seed), check=True).stdout
        for seed in ("1", "2")
    ]
    assert outs[0] == outs[1]
    assert outs[0].count(b'"rule"') >= 5
