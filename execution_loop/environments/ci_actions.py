"""The fix_ci_failure action language: parse the model's text, apply it to the working copy.

Every path is resolved inside the working copy (no absolute paths, ``..``, ``.git``,
or symlinks leading out of it), because these writes are made by our process, outside
the sandbox.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from execution_loop.environments.ci_repo import SKIP_FILE

MAX_SHOWN_BYTES = 16384
USAGE = "expected run_tests, cat <file>, edit <file>, replace <file> or skip_test <name>"
_BLOCK = re.compile(r"<<<<<<< SEARCH\n(.*?)\n=======\n(.*?)>>>>>>> REPLACE\s*$", re.DOTALL)
_TEST_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_COMMANDS = {
    "run_tests": "retry_ci",
    "retry_ci": "retry_ci",
    "cat": "read_source",
    "edit": "edit_source",
    "replace": "edit_source",
    "skip_test": "skip_test",
}


@dataclass(frozen=True)
class Action:
    """A parsed command; ``kind`` is the contract's action name."""

    kind: str  # retry_ci | read_source | edit_source | skip_test
    target: str = ""  # the file, or the test's name
    content: str | None = None  # edit: the full new content
    search: str | None = None  # replace: the text to find (exactly once)
    replacement: str | None = None


@dataclass(frozen=True)
class ActionResult:
    """Whether the action could be applied, and what the agent sees."""

    ok: bool
    observation: str


def parse_action(text: str) -> Action | str:
    """The action, or a message saying what is wrong with the text."""
    first, _, rest = text.lstrip().partition("\n")
    words = first.split()
    if not words:
        return f"empty action; {USAGE}"
    command = words[0].lower()
    kind = _COMMANDS.get(command)
    if kind is None:
        return f"unknown command {words[0][:40]!r}; {USAGE}"
    if kind == "retry_ci":
        return Action(kind) if len(words) == 1 else "run_tests takes no arguments"
    if len(words) != 2:
        return f"{command} takes exactly one argument"
    target = words[1]
    if kind == "skip_test":
        return Action(kind, target) if _TEST_NAME.match(target) else f"bad test name {target!r}"
    if command == "edit":
        content = rest if rest.endswith("\n") or not rest else rest + "\n"
        return Action(kind, target, content=content)
    if command == "replace":
        block = _BLOCK.search(rest)
        if block is None:
            return "replace needs <<<<<<< SEARCH, ======= and >>>>>>> REPLACE lines"
        return Action(
            kind, target, search=block.group(1), replacement=block.group(2).removesuffix("\n")
        )
    return Action(kind, target)


def resolve_inside(workdir: Path, relative: str) -> Path | None:
    """``workdir / relative`` if it stays inside the working copy and outside .git."""
    path = PurePosixPath(relative)
    if path.is_absolute() or not path.parts or ".." in path.parts:
        return None
    root = workdir.resolve()
    resolved = (root / path).resolve()
    if not resolved.is_relative_to(root) or resolved == root:
        return None
    return None if ".git" in resolved.relative_to(root).parts else resolved


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def apply_action(action: Action, workdir: Path) -> ActionResult:
    """Apply a file action (not ``retry_ci``) to the working copy."""
    if action.kind == "skip_test":
        return _skip(workdir, action.target)
    path = resolve_inside(workdir, action.target)
    if path is None:
        return ActionResult(False, f"{action.target!r} is not a file in this repository")
    exists = _is_regular(path)
    if path.exists() and not exists:
        return ActionResult(False, f"{action.target} is not a regular file")
    if action.kind == "read_source":
        if not exists:
            return ActionResult(False, f"no such file: {action.target}")
        data = path.read_bytes()
        shown = data[:MAX_SHOWN_BYTES].decode("utf-8", "replace")
        cut = (
            f"\n[... {len(data) - MAX_SHOWN_BYTES} bytes not shown ...]"
            if len(data) > MAX_SHOWN_BYTES
            else ""
        )
        return ActionResult(True, f"{action.target}:\n{shown}{cut}")
    if action.content is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(action.content)
        return ActionResult(True, f"wrote {action.target} ({action.content.count(chr(10))} lines)")
    if not exists:
        return ActionResult(False, f"no such file: {action.target}")
    text = path.read_text(errors="replace")
    found = text.count(action.search or "") if action.search else 0
    if found != 1:
        why = "not found" if found == 0 else f"found {found} times; make it unique"
        return ActionResult(False, f"search text {why} in {action.target}")
    path.write_text(text.replace(action.search or "", action.replacement or "", 1))
    return ActionResult(True, f"replaced 1 block in {action.target}")


def _skip(workdir: Path, name: str) -> ActionResult:
    path = resolve_inside(workdir, SKIP_FILE)
    if path is None or (path.exists() and not _is_regular(path)):
        return ActionResult(False, f"{SKIP_FILE} is not a regular file")
    listed = path.read_text(errors="replace").split() if path.exists() else []
    if name not in listed:
        path.write_text("".join(f"{n}\n" for n in [*listed, name]))
    return ActionResult(True, f"added {name} to {SKIP_FILE}")
