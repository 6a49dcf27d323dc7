"""The verifier's own run of a repository's pinned tests: pytest, in a process it starts.

The agent never chooses how its code is judged. ``run_pinned_suite`` starts a fresh
``python -I -B`` in the sandbox, in a tree whose tests the verifier restored from the
pinned commit, and runs pytest with a configuration the verifier writes:

- nothing the agent controls is on the command line, and nothing about the verdict is:
  the boot code reads the plugin (``ci_guard``) and its settings from stdin;
- no plugin autoload (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``), no cache provider, an empty
  ini file of ours (``-c``), the tree as ``--rootdir`` and ``tests/`` as
  ``--confcutdir`` (only the pinned ``tests/conftest.py`` can load), ``xfail_strict``;
- the JUnit XML and the guard's verdict go to a fresh private folder beside a copy of the
  tree, made for this run after the episode (so nothing the agent did in its episode can
  be there), read as regular files only;
- the result is read from two channels that must agree: the process's exit status
  (0 only when pytest passed and the guard saw no tampering) and the JUnit XML, which
  must list exactly the tests the pinned files define, each passed.

Stdlib only at run time (the verifier imports this module without site-packages); the
pytest process itself uses the interpreter's site-packages, so pytest must be installed.
"""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from execution_loop.environments.ci_repo import MAX_REPORT_BYTES, read_regular_file
from execution_loop.sandbox import SandboxBackend, SandboxLimits
from triloop.environment_code import parse_source

GUARD_SOURCE = Path(__file__).with_name("ci_guard.py")
TAMPERED = 97  # ci_guard.TAMPERED (not imported: ci_guard needs pytest)
_BOOT = """
import json, os, sys
settings = json.loads(sys.stdin.readline())
source = sys.stdin.read()
sys.stdin = open(os.devnull)
os.chdir(settings["root"])
sys.path.insert(0, os.getcwd())
namespace = {"__name__": "triloop_ci_guard"}
exec(compile(source, "<triloop ci guard>", "exec"), namespace)
guard = namespace["Guard"](settings)
import pytest
sys.exit(pytest.main(settings["args"], plugins=[guard]))
"""
_INI = "[pytest]\naddopts =\nxfail_strict = true\njunit_family = xunit2\n"


@dataclass(frozen=True)
class SuiteRun:
    """One verifier-run of the pinned tests; ``statuses`` maps a test's name to its result."""

    exit_code: int
    log: str
    limit_exceeded: str | None
    statuses: dict[str, str] = field(default_factory=dict)  # passed | failed | error | skipped
    coverage: float = 0.0  # line coverage of the code outside tests/, as a fraction
    tampering: list[str] = field(default_factory=list)  # why the run cannot be trusted
    collection_errors: list[str] = field(default_factory=list)

    @property
    def trusted(self) -> bool:
        """True when both channels agree and nothing changed the harness."""
        return not self.tampering


def pinned_tests(tree: Path) -> dict[str, str]:
    """Test name -> test file (relative) for every ``test_*`` function of ``tests/test_*.py``.

    Read with ``ast``, never imported: this is what the JUnit XML must account for.
    """
    found: dict[str, str] = {}
    for path in sorted((tree / "tests").glob("test_*.py")):
        rel = path.relative_to(tree).as_posix()
        # Episodes and task descriptions call this on threads of one worker: parse_source.
        for node in parse_source(path.read_bytes()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
                node.name.startswith("test")
            ):
                if node.name in found:
                    raise ValueError(f"test {node.name} is defined twice in the pinned tests")
                found[node.name] = rel
    return found


def run_pinned_suite(
    sandbox: SandboxBackend,
    tree: Path,
    limits: SandboxLimits,
    expected: dict[str, str],
    *,
    not_covered: tuple[str, ...] = (),
    expose: tuple[Path, ...] = (),
) -> SuiteRun:
    """Run pytest on a copy of ``tree`` in a fresh process; read the verdict from both channels.

    The run's folder holds the copy and the verdict folder, side by side: a sandbox that
    lets a command write only its work directory (bubblewrap) still lets pytest write its
    report, and nothing the agent's episode could reach. ``expose``: the folders holding
    pytest (the worker's Python installation), read-only.
    """
    run_root = Path(tempfile.mkdtemp(prefix="triloop-suite-"))
    try:
        copy = run_root / "tree"
        test_files = sorted(set(expected.values()))
        pinned_hashes = {
            rel: hashlib.sha256((tree / rel).read_bytes()).hexdigest() for rel in test_files
        }
        shutil.copytree(tree, copy, symlinks=True)
        tree = copy
        private = run_root / "verdict"
        private.mkdir()
        junit, verdict = private / "junit.xml", private / "verdict.json"
        ini = private / "pytest.ini"
        ini.write_text(_INI)
        settings = {
            "root": str(tree),
            "verdict": str(verdict),
            "not_covered": list(not_covered),  # e.g. the repository's own CI runner
            "pinned_tests": pinned_hashes,
            "args": [
                "-c",
                str(ini),
                "--rootdir",
                str(tree),
                "--confcutdir",
                str(tree / "tests"),
                "-p",
                "no:cacheprovider",
                "-p",
                "no:stepwise",
                "-q",
                "-rN",
                "--junitxml",
                str(junit),
                "tests",
            ],
        }
        stdin = json.dumps(settings) + "\n" + GUARD_SOURCE.read_text()
        result = sandbox.run(
            [sys.executable, "-I", "-B", "-c", _BOOT],
            limits=limits,
            workdir=run_root,
            stdin=stdin,
            extra_env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"},
            expose=expose,
        )
        log = result.stdout + (f"\n{result.stderr}" if result.stderr.strip() else "")
        statuses, problems, errors = _read_junit(junit, expected)
        guard = _read_json(verdict)
    finally:
        shutil.rmtree(run_root, ignore_errors=True)
    if result.limit_exceeded:
        return SuiteRun(result.exit_code, log, result.limit_exceeded, statuses)
    tampering = list(problems)
    if guard is None:
        tampering.append("the run ended before the verifier's plugin wrote its verdict")
    else:
        tampering += [str(p) for p in guard.get("tampering") or []]
    if result.exit_code == TAMPERED and not tampering:
        tampering.append("the process exited with the tampering status")
    all_passed = bool(statuses) and all(s == "passed" for s in statuses.values())
    if all_passed and set(statuses) == set(expected) and result.exit_code != 0:
        tampering.append(f"every test passed but the run exited with {result.exit_code}")
    if result.exit_code == 0 and not all_passed:
        tampering.append("the run exited with 0 but not every test passed")
    data = (guard or {}).get("coverage") or {}
    covered, total = data.get("covered", 0), data.get("total", 0)
    coverage = covered / total if isinstance(total, int) and total > 0 else 0.0
    return SuiteRun(result.exit_code, log, None, statuses, coverage, tampering, errors)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        loaded = json.loads(read_regular_file(path, MAX_REPORT_BYTES))
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def _read_junit(
    path: Path, expected: dict[str, str]
) -> tuple[dict[str, str], list[str], list[str]]:
    """Each expected test's status, what is wrong with the report, and collection errors."""
    try:
        data = read_regular_file(path, MAX_REPORT_BYTES + 1)
    except OSError:
        return {}, ["pytest wrote no JUnit XML"], []
    if len(data) > MAX_REPORT_BYTES or b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        return {}, ["the JUnit XML is oversized or declares entities"], []
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as exc:
        return {}, [f"the JUnit XML does not parse: {exc}"], []
    statuses: dict[str, str] = {}
    problems: list[str] = []
    errors: list[str] = []
    for case in root.iter("testcase"):
        name, classname = case.get("name", ""), case.get("classname", "")
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        status = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(
            kinds[0] if kinds else "", "passed"
        )
        if name not in expected:
            if status != "passed" and not name:
                errors.append(classname)
            elif status == "error" or status == "failed":
                errors.append(f"{classname}.{name}" if classname else name)
            else:
                problems.append(f"the JUnit XML reports an unknown test {classname}::{name}")
            continue
        module = expected[name].removesuffix(".py").replace("/", ".")
        if classname != module:
            problems.append(f"the JUnit XML puts {name} in {classname}, not {module}")
        if name in statuses:
            problems.append(f"the JUnit XML reports {name} twice")
        statuses[name] = status
    return statuses, problems, errors
