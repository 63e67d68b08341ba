"""Lines for user frames that were already running when the profiler started.

Kineto's Python tracer records a frame that is on the stack when tracing starts with the line it
was at then, and every later call with the callee's `def` line only. A training loop at module
level (or in a function that never returns) is such a frame: every event of the window would
point at the line where the window opened, often `opt.step()`. The calls the stale frame makes
during the window are its children, in time order; the loop's source holds the same calls in
evaluation order. Aligning the two (an edit distance, the loop body repeated) gives each child
the line that made it. Children whose line a trainprof probe carries (`host_read:...@file:line`)
are pinned to it. A child the alignment cannot place gets no line: better none than a wrong one.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Mapping
from functools import lru_cache

import numpy as np

HEADER = frozenset({"__next__", "__iter__"})  # a for loop's header: iter() and next()
CALL = "()"  # a call of an object (`model(x)`): Kineto names the module or `_call_impl`
_OBJECT_CALLS = {"_wrapped_call_impl", "_call_impl", "__call__"}
_BUILTIN = re.compile(r"^<built-in (?:method|function) (\w+)")
_FRAME = re.compile(r"^.+?\(\d+\): (?P<func>.*)$")
# Costs of the alignment: an exact name match is free, a call of an object matched to a call
# whose name no child has is cheap, an unknown wrapper (torch's `inner`, trainprof's `read`)
# matched to anything costs more; a child left unmatched costs 1. A source call without a child
# is common (a class with a C constructor, a builtin the tracer does not see): it costs little.
_OBJECT_COST, _WILDCARD_COST, _SKIP, _SKIP_SOURCE = 0.3, 0.6, 1.0, 0.05
MAX_CELLS = 4_000_000


def call_name(frame: str) -> str:
    """The name a child frame is called by in source: `item`, `step`, CALL for `model(x)`."""
    if frame.startswith("nn.Module: "):
        return CALL
    m = _BUILTIN.match(frame)
    if m:
        return m.group(1)
    m = _FRAME.match(frame)
    func = m.group("func") if m else frame
    return CALL if func in _OBJECT_CALLS else func


@lru_cache(maxsize=64)
def _parse(path: str) -> ast.Module | None:
    try:
        with open(path, encoding="utf-8") as f:
            return ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None


def find_source(
    path: str, dirs: tuple[str, ...], kept: Mapping[str, str] | None = None
) -> str | None:
    """The file Kineto named `path` (often relative to sys.path), or None when not found.
    `kept`: copies of files as the run ran them (absolute path -> the copy's path,
    capture/sources), read instead of the file as it is now."""
    kept = kept or {}
    candidates = [path] if os.path.isabs(path) else [os.path.join(d, path) for d in dirs]
    for candidate in candidates:
        copy = kept.get(os.path.abspath(candidate))
        if copy is not None and os.path.isfile(copy):
            return copy
    if not os.path.isabs(path):
        candidates.append(os.path.join(os.getcwd(), path))
    return next((c for c in candidates if os.path.isfile(c)), None)


def _scope(tree: ast.Module, func: str, line: int) -> ast.AST | None:
    if func == "<module>":
        return tree
    best = None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name == func
            and node.lineno <= line <= (node.end_lineno or node.lineno)
            and (best is None or node.lineno > best.lineno)
        ):
            best = node
    return best


_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _innermost_loop(scope: ast.AST, line: int) -> ast.AST | None:
    """The innermost for/while loop of `scope` (not of a nested def) holding `line`."""
    best = None
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, _NESTED):
            continue
        if isinstance(node, ast.For | ast.While | ast.AsyncFor) and (
            node.lineno <= line <= (node.end_lineno or node.lineno)
        ):
            best = node
        stack.extend(ast.iter_child_nodes(node))
    return best


class _Calls(ast.NodeVisitor):
    """Calls in evaluation order (arguments before the call), loop headers as `__next__`."""

    def __init__(self) -> None:
        self.out: list[tuple[int, frozenset[str]]] = []

    def visit_Call(self, node: ast.Call) -> None:
        fn = node.func
        if isinstance(fn, ast.Attribute):
            self.visit(fn.value)
            name = fn.attr
        elif isinstance(fn, ast.Name):
            name = fn.id
        else:
            self.visit(fn)
            name = CALL
        for a in node.args:
            self.visit(a)
        for k in node.keywords:
            self.visit(k.value)
        self.out.append((node.lineno, frozenset({name, CALL})))

    def visit_For(self, node: ast.For) -> None:
        self.visit(node.iter)
        self.out.append((node.lineno, HEADER))
        for stmt in node.body:
            self.visit(stmt)

    visit_AsyncFor = visit_For  # noqa: N815 (ast.NodeVisitor's naming)

    def _skip(self, node: ast.AST) -> None:
        return None

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _skip  # noqa: N815

    def _comprehension(self, node: ast.AST) -> None:
        self.out.append((node.lineno, frozenset({f"<{type(node).__name__.lower()}>"})))

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension  # noqa: N815


def loop_calls(path: str, func: str, line: int) -> tuple[list[tuple[int, frozenset[str]]], bool]:
    """(calls of the innermost loop around `line` in `func` of `path`, whether they repeat);
    ([], False) when the source is not there."""
    tree = _parse(path)
    scope = _scope(tree, func, line) if tree is not None else None
    if scope is None:
        return [], False
    loop = _innermost_loop(scope, line)
    v = _Calls()
    if loop is None:
        for stmt in getattr(scope, "body", []):
            v.visit(stmt)
        return v.out, False
    if isinstance(loop, ast.While):
        v.visit(loop.test)
        for stmt in loop.body:
            v.visit(stmt)
    else:  # the iterable is evaluated once, before the loop: only the header repeats
        v.out.append((loop.lineno, HEADER))
        for stmt in loop.body:
            v.visit(stmt)
    return v.out, True


def align(
    children: list[tuple[str, int | None]],
    calls: list[tuple[int, frozenset[str]]],
    start_line: int,
    repeats: bool,
) -> list[int | None]:
    """The source line of each child (name, pinned line or None), in time order; None where
    the alignment leaves a child unmatched. The first child is the call running at
    `start_line` when tracing started."""
    if not children or not calls:
        return [None] * len(children)
    first = next((k for k, (ln, _) in enumerate(calls) if ln == start_line), None)
    if first is None:
        return [None] * len(children)
    base = calls[first:] + (calls[:first] if repeats else [])
    n = len(base)
    reps = (len(children) // max(n // 2, 1) + 2) if repeats else 1
    if len(children) * n * reps > MAX_CELLS:
        reps = max(1, MAX_CELLS // max(len(children) * n, 1))
    lines = np.array([ln for ln, _ in base] * reps, np.int64)
    source_names = set().union(*(names for _, names in base))
    known = {name for name, _ in children}
    # A pin outside the loop is a read in code the loop called (a dataset in the same file).
    in_loop = {ln for ln, _ in base}
    children = [(name, pin if pin in in_loop else None) for name, pin in children]
    cost_of: dict[tuple[str, int | None], np.ndarray] = {}

    def cost(name: str, pin: int | None) -> np.ndarray:
        hit = cost_of.get((name, pin))
        if hit is None:
            if pin is not None:
                c = [0.0 if ln == pin else np.inf for ln, _ in base]
            elif name in source_names and name != CALL:
                c = [0.0 if name in names else np.inf for _, names in base]
            elif name == CALL:
                c = [_OBJECT_COST if not (names - {CALL}) & known else np.inf for _, names in base]
            else:
                c = [_WILDCARD_COST] * n
            hit = cost_of[(name, pin)] = np.tile(np.array(c), reps)
        return hit

    # A header also takes the calls of an epoch change (`__next__` ends, `__iter__` restarts).
    header = np.tile(np.array([names == HEADER for _, names in base]), reps)
    stay = np.where(header, 0.0, np.inf)
    m = len(lines)
    ar = np.arange(m + 1, dtype=float)
    dp = np.empty((len(children) + 1, m + 1))
    dp[0] = ar * _SKIP_SOURCE
    for i, (name, pin) in enumerate(children, 1):
        prev = dp[i - 1]
        b = prev + _SKIP  # the child left unmatched
        b[1:] = np.minimum(b[1:], prev[:-1] + cost(name, pin))
        if name in HEADER:
            b[1:] = np.minimum(b[1:], prev[1:] + stay)
        dp[i] = ar * _SKIP_SOURCE + np.minimum.accumulate(b - ar * _SKIP_SOURCE)
    out: list[int | None] = [None] * len(children)
    i, j = len(children), int(np.argmin(dp[-1]))
    while i > 0:
        if j > 0 and np.isclose(dp[i, j], dp[i, j - 1] + _SKIP_SOURCE):
            j -= 1
            continue
        name, pin = children[i - 1]
        if j > 0 and np.isclose(dp[i, j], dp[i - 1, j - 1] + cost(name, pin)[j - 1]):
            out[i - 1] = int(lines[j - 1])
            j -= 1
        elif j > 0 and name in HEADER and np.isclose(dp[i, j], dp[i - 1, j] + stay[j - 1]):
            out[i - 1] = int(lines[j - 1])
        i -= 1
    return out
