"""The pytest plugin that watches the run judging the agent's code; it loads before that code.

``ci_suite`` never imports this module: it sends its source over stdin to a fresh
``python -I -B`` whose boot code builds the plugin from it, so the plugin and its
settings (where the verdict goes, the pinned tests' hashes) are on no command line,
in no environment variable and in no file of the tree under test. The plugin:

- refuses a test file whose bytes differ from the pinned ones when pytest is about to
  import it (agent code running earlier could have rewritten it on disk);
- records line coverage of the code outside ``tests/`` (``sys.settrace``);
- takes a snapshot, before any agent code runs, of the callables of pytest's runner,
  reporting and JUnit modules, of ``builtins``, and of the exits, and compares it at the
  end; it also checks that each pinned test module still binds only the names its
  source binds, to the functions it defines (code monkeypatched into them is tampering);
- ends the process itself with ``os._exit`` once pytest has written its JUnit XML, so
  an ``atexit`` hook, or any other clean-up the agent's code registered, never runs;
  a tampered run exits with ``TAMPERED``.

Everything the hooks need is bound when the plugin is built, so rebinding a module
global later changes nothing. What it cannot stop: code that walks the interpreter's
memory (``gc``) to rewrite the plugin's own state; a container backend closes that.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import importlib
import json
import os
import sys
from pathlib import Path
from types import CodeType, FrameType, ModuleType
from typing import Any

import pytest

TAMPERED = 97  # exit status of a run whose harness was changed by the code under test
WATCHED_MODULES = (
    "_pytest.runner",
    "_pytest.python",
    "_pytest.reports",
    "_pytest.junitxml",
    "_pytest.skipping",
    "_pytest.outcomes",
    "_pytest.main",
    "_pytest.unittest",
    "_pytest.nodes",
    "_pytest.terminal",
)
WATCHED_ATTRIBUTES = (("os", "_exit"), ("os", "write"), ("os", "replace"), ("sys", "exit"))


def _callables(owner: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, value in list(vars(owner).items()):
        if callable(value) or isinstance(value, staticmethod | classmethod | property):
            found[name] = value
    return found


def _snapshot() -> dict[str, Any]:
    """Every watched callable, keyed by a dotted name (objects kept, so ids stay unique)."""
    taken: dict[str, Any] = {}
    for module_name in WATCHED_MODULES:
        module = importlib.import_module(module_name)
        for name, value in _callables(module).items():
            taken[f"{module_name}.{name}"] = value
            if isinstance(value, type) and value.__module__ == module_name:
                for attr, member in _callables(value).items():
                    taken[f"{module_name}.{name}.{attr}"] = member
    for name, value in _callables(builtins).items():
        taken[f"builtins.{name}"] = value
    for module_name, attr in WATCHED_ATTRIBUTES:
        taken[f"{module_name}.{attr}"] = getattr(sys.modules[module_name], attr)
    return taken


def _changed(before: dict[str, Any]) -> list[str]:
    after = _snapshot()
    return sorted(name for name, value in before.items() if after.get(name) is not value)


def _bound_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Names a module's top level binds, and those bound by ``def``."""
    names: set[str] = set()
    functions: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            functions.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        else:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
    return names | functions, functions


def _test_module_problems(module: ModuleType, source: bytes) -> list[str]:
    path = str(getattr(module, "__file__", ""))
    bound, functions = _bound_names(ast.parse(source))
    problems = []
    for name in sorted(vars(module)):
        if name.startswith(("__", "@")):  # module dunders; pytest's assertion helpers
            continue
        if name not in bound:
            problems.append(f"{module.__name__}.{name} was added")
    for name in sorted(functions):
        code = getattr(getattr(module, name, None), "__code__", None)
        if not isinstance(code, CodeType) or code.co_filename != path:
            problems.append(f"{module.__name__}.{name} was replaced")
    return problems


class Guard:
    """The plugin object; built by the boot code from the verifier's settings."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.root = Path(settings["root"])
        self.verdict = Path(settings["verdict"])
        self.pinned: dict[str, str] = dict(settings["pinned_tests"])  # rel path -> sha256
        self.sources = {rel: (self.root / rel).read_bytes() for rel in self.pinned}
        self.problems: list[str] = []
        self.exit_status = 1
        self.before = _snapshot()
        self.lines: dict[str, set[int]] = {}
        self._exit, self._settrace, self._dumps = os._exit, sys.settrace, json.dumps
        self._stdout, self._stderr = sys.__stdout__, sys.__stderr__
        not_covered = set(settings.get("not_covered") or [])
        for path in sorted(self.root.rglob("*.py")):
            rel = path.relative_to(self.root).parts
            if "tests" not in rel and ".git" not in rel and "/".join(rel) not in not_covered:
                self.lines[str(path)] = set()

    def trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        """``sys.settrace`` hook: record executed lines of the code under test."""
        del event, arg
        lines = self.lines.get(frame.f_code.co_filename)
        if lines is None:
            return None

        def local(frame: FrameType, event: str, _arg: Any) -> Any:
            if event == "line":
                lines.add(frame.f_lineno)
            return local

        return local

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: Any) -> None:
        """Start coverage before any test module (and so any agent code) is imported."""
        del config
        self._settrace(self.trace)

    def pytest_collectstart(self, collector: Any) -> None:
        """Refuse a test file whose bytes are no longer the pinned ones."""
        path = getattr(collector, "path", None)
        if path is None or not str(path).endswith(".py"):
            return
        rel = Path(path).relative_to(self.root).as_posix()
        if (
            rel in self.pinned
            and hashlib.sha256(Path(path).read_bytes()).hexdigest() != (self.pinned[rel])
        ):
            self.problems.append(f"{rel} was rewritten before it was imported")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        """Remember pytest's own verdict; the plugin ends the process with it."""
        del session
        self.exit_status = int(exitstatus)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: Any) -> None:
        """After every other plugin (JUnit XML is written): check, write, exit."""
        del config
        self._settrace(None)
        problems = list(self.problems) + [f"{n} was changed" for n in _changed(self.before)]
        for rel, source in self.sources.items():
            module = next(
                (
                    m
                    for m in list(sys.modules.values())
                    if str(getattr(m, "__file__", "")) == str(self.root / rel)
                ),
                None,
            )
            if module is not None:
                problems += _test_module_problems(module, source)
        covered = total = 0
        for path, seen in self.lines.items():
            executable = _executable_lines(Path(path))
            covered, total = covered + len(seen & executable), total + len(executable)
        document = {
            "exit_status": self.exit_status,
            "tampering": problems,
            "coverage": {"covered": covered, "total": total},
        }
        self.verdict.write_text(self._dumps(document, sort_keys=True))
        for stream in (self._stdout, self._stderr):
            if stream is not None:
                stream.flush()
        self._exit(TAMPERED if problems else self.exit_status)


def _executable_lines(path: Path) -> set[int]:
    try:
        stack: list[CodeType] = [compile(path.read_bytes(), str(path), "exec")]
    except (SyntaxError, ValueError, OSError):
        return set()
    lines: set[int] = set()
    while stack:
        code = stack.pop()
        lines.update(line for _, _, line in code.co_lines() if line)
        stack.extend(c for c in code.co_consts if isinstance(c, CodeType))
    return lines
