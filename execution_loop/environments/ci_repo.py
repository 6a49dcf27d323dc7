"""The fix_ci_failure repository: built reproducibly from fixtures, and its CI run.

``build_repository`` turns the fixture folder into a git repository with one commit
whose author, committer, dates, message and file modes are fixed, with the user's and
the system's git configuration shut out, so the commit hash is the same on every
machine and every time: the contract pins it. Only our own code runs git, and never in
a working copy the agent's code has run in (a planted hook or config would run outside
the sandbox).

Stdlib only at run time (the verifier imports this module without site-packages).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from execution_loop.sandbox import DEFAULT_PATH, SandboxBackend, SandboxLimits

RUNNER = "run_tests.py"
SKIP_FILE = "ci_skip.txt"
MAX_REPORT_BYTES = 4 * 2**20
PROTECTED = ("tests", RUNNER)  # the verifier always uses the pinned copies of these
# Files a test runner or the interpreter loads on its own: anywhere outside tests/ the
# verifier removes them (tests/ is the pinned copy), so only pinned ones can take effect.
AUTOLOADED = frozenset({
    "conftest.py", "pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini", ".pytest.ini",
    "sitecustomize.py", "usercustomize.py",
})
_IGNORED = shutil.ignore_patterns(".git", "__pycache__", "*.pyc")
_PINNED_TIME = "2024-01-01T00:00:00+00:00"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "triloop fixtures",
    "GIT_AUTHOR_EMAIL": "fixtures@triloop.invalid",
    "GIT_AUTHOR_DATE": _PINNED_TIME,
    "GIT_COMMITTER_NAME": "triloop fixtures",
    "GIT_COMMITTER_EMAIL": "fixtures@triloop.invalid",
    "GIT_COMMITTER_DATE": _PINNED_TIME,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "LANG": "C",
}


class FixtureError(RuntimeError):
    """The repository fixture cannot be built, or no longer builds the pinned commit."""


def _git(args: list[str], cwd: Path) -> str:
    env = {"PATH": DEFAULT_PATH, "HOME": str(cwd), **_GIT_ENV}
    try:
        done = subprocess.run(
            ["git", "-c", "init.defaultBranch=main", "-c", "commit.gpgSign=false", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
    except FileNotFoundError as exc:
        raise FixtureError("git is not installed; fix_ci_failure needs it") from exc
    except subprocess.CalledProcessError as exc:
        raise FixtureError(f"git {' '.join(args)} failed: {exc.stderr.strip()}") from exc
    return done.stdout.strip()


def build_repository(fixture: Path, dest: Path) -> str:
    """Create the pinned repository from the fixture folder; returns the commit hash.

    Every repository's CI runs the same runner: one ``run_tests.py`` kept beside the
    fixture folders is copied into each (a fixture's own copy, if it has one, wins).
    """
    if not fixture.is_dir():
        raise FixtureError(f"repository fixture {fixture} is not a folder")
    shutil.copytree(fixture, dest, ignore=_IGNORED)
    shared_runner = fixture.parent / RUNNER
    if not (dest / RUNNER).exists() and shared_runner.is_file():
        shutil.copyfile(shared_runner, dest / RUNNER)
    for path in dest.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)  # git records the mode: fix it
    _git(["init", "-q"], dest)
    _git(["add", "-A"], dest)
    _git(["commit", "-q", "--no-verify", "-m", "Pinned fixture: CI is failing"], dest)
    return _git(["rev-parse", "HEAD"], dest)


@dataclass(frozen=True)
class CiRun:
    """One run of the repository's CI."""

    exit_code: int
    log: str
    report: dict[str, Any] | None  # the runner's JSON report; None if it wrote none
    limit_exceeded: str | None
    statuses: dict[str, str] = field(default_factory=dict)


def run_ci(
    sandbox: SandboxBackend, workdir: Path, report_path: Path, limits: SandboxLimits
) -> CiRun:
    """Run ``python run_tests.py --report FILE`` in the working copy, in the sandbox.

    The report is the agent's code's to write (it runs in that process), so it is read
    as the agent's output: never through a link, never anything but a regular file.
    """
    discard(report_path)
    command = [sys.executable, "-I", "-S", "-B", RUNNER, "--report", str(report_path)]
    result = sandbox.run(command, limits=limits, workdir=workdir)
    report: dict[str, Any] | None = None
    try:
        loaded = json.loads(read_regular_file(report_path, MAX_REPORT_BYTES))
        report = loaded if isinstance(loaded, dict) else None
    except (OSError, ValueError):
        report = None
    tests = report.get("tests") if report else None
    statuses = {str(k): str(v) for k, v in tests.items()} if isinstance(tests, dict) else {}
    log = result.stdout + (f"\n{result.stderr}" if result.stderr.strip() else "")
    return CiRun(result.exit_code, log, report, result.limit_exceeded, statuses)


def read_regular_file(path: Path, limit: int) -> bytes:
    """Up to ``limit`` bytes of a regular file; ``OSError`` for a link, folder or FIFO.

    The sandboxed code may have put anything at ``path``; our process must not follow a
    link it planted (to a host file) or block on a pipe.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.read(fd, limit)
    finally:
        os.close(fd)


def discard(path: Path) -> None:
    """Remove whatever is at ``path`` (a file, a link, a folder), following no link."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()  # a FIFO or socket


def summarise(run: CiRun) -> str:
    """One line for the agent: counts and the failing tests' names."""
    if run.report is None:
        return "unavailable (the runner wrote no report)"
    counts = {
        s: sorted(n for n, v in run.statuses.items() if v == s)
        for s in ("passed", "failed", "skipped")
    }
    text = ", ".join(f"{len(names)} {s}" for s, names in counts.items())
    if counts["failed"]:
        text += f"; failing: {', '.join(counts['failed'])}"
    errors = run.report.get("collection_errors") or []
    return text + (f"; cannot import: {', '.join(map(str, errors))}" if errors else "")


def coverage(run: CiRun) -> float:
    """Line coverage of the code under test as a fraction (0.0 without a report)."""
    data = (run.report or {}).get("coverage") or {}
    covered, total = data.get("covered", 0), data.get("total", 0)
    return covered / total if isinstance(total, int) and total > 0 else 0.0


def candidate_tree(workdir: Path, pinned: Path, dest: Path) -> list[str]:
    """The agent's code with the pinned tests and runner, without files that load themselves.

    Returns the protected paths the agent changed and the self-loading files it added.
    """
    shutil.copytree(workdir, dest, ignore=_IGNORED, symlinks=True, copy_function=_copy_regular)
    changed = []
    for name in PROTECTED:
        ours, theirs = pinned / name, dest / name
        if _tree_bytes(ours) != _tree_bytes(theirs):
            changed.append(name)
        _remove(theirs)
        if ours.is_dir():
            shutil.copytree(ours, theirs, ignore=_IGNORED)
        else:
            shutil.copyfile(ours, theirs)
    _remove(dest / SKIP_FILE)  # the verifier runs every test; skips are counted apart
    for path in sorted(dest.rglob("*")):
        rel = path.relative_to(dest)
        pinned_copy = pinned / rel
        loads_itself = path.name in AUTOLOADED or path.suffix == ".pth"
        if not loads_itself or rel.parts[0] == "tests" or not (path.exists() or path.is_symlink()):
            continue
        if _tree_bytes(path) != _tree_bytes(pinned_copy):
            changed.append(rel.as_posix())
        _remove(path)
        if pinned_copy.is_file() and not pinned_copy.is_symlink():
            shutil.copyfile(pinned_copy, path)
    return changed


def skipped_tests(workdir: Path) -> list[str]:
    """Names the agent listed in the working copy's skip file."""
    path = workdir / SKIP_FILE
    if path.is_symlink() or not path.is_file():
        return []
    return sorted(set(path.read_text(errors="replace").split()))


def _copy_regular(src: str, dst: str) -> None:
    # FIFOs and devices the agent's code may have made would block or mislead a copy.
    if stat.S_ISREG(os.lstat(src).st_mode):
        shutil.copy2(src, dst)


def fixture_digests(fixture: Path) -> dict[str, str]:
    """sha256 of each file ``build_repository`` puts in the repository, by relative path
    (the shared runner included): the fixture bytes the agent and the verifier see."""
    if not fixture.is_dir():
        raise FixtureError(f"repository fixture {fixture} is not a folder")
    files = {
        p.relative_to(fixture).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in regular_files(fixture) if not p.name.endswith(".pyc")
    }
    shared_runner = fixture.parent / RUNNER
    if RUNNER not in files and shared_runner.is_file():
        files[RUNNER] = hashlib.sha256(shared_runner.read_bytes()).hexdigest()
    return files


def regular_files(root: Path) -> list[Path]:
    """Regular files under ``root`` (no symlinks, FIFOs, caches or .git), sorted."""
    found = []
    for path in sorted(root.rglob("*")):
        parts = path.relative_to(root).parts
        if ".git" in parts or "__pycache__" in parts:
            continue
        if stat.S_ISREG(os.lstat(path).st_mode):
            found.append(path)
    return found


def _tree_bytes(path: Path) -> dict[str, bytes] | None:
    if path.is_symlink() or not path.exists():
        return None
    if path.is_file():
        return {"": path.read_bytes()}
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in regular_files(path)}


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
