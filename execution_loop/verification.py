"""Run an environment's verifier in its own process, outside the agent's sandbox.

An environment's ``outcome()`` never decides success itself: it hands the episode's
record (seed, the actions as the model wrote them, paths of the working copy) to a
verifier function, which this module runs in a fresh interpreter. The verifier
rebuilds what it needs from the seed and the pinned fixtures and trusts nothing the
agent printed. The interpreter starts without site-packages (``-I -S``), so verifier
modules import only the standard library; that keeps a verification to tens of
milliseconds, which matters when every RL episode needs one.

A verifier is ``execution_loop.environments.<module>:<function>`` or lives in the
package of an installed environment plugin (``triloop.environments`` entry point);
the plugin's installation folder is then added to the verifier interpreter's path.

A verifier module that needs an installed package names its distribution in
``VERIFIER_DISTRIBUTIONS`` (``("reasoning-gym",)``). The interpreter still starts
without site-packages; it gets an import finder that finds exactly the top-level
packages of the named distributions and of their installed requirements, and nothing
else, so an import the module did not declare fails as it always has. What those
distributions' files hash to is part of the verifier hash and the version's code hashes
(``triloop.environment_code``). A heavy distribution costs its import time once per
verifier interpreter, that is once per batch of episodes.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import json
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from execution_loop.environments.base import Outcome
from execution_loop.sandbox import LocalProcessSandbox, SandboxBackend, SandboxLimits
from triloop.environment_code import (
    declared_distributions,
    module_file,
    plugin_search_path,
    verifier_imports,
)

VERIFIER_PACKAGE = "execution_loop.environments."
PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LIMITS = SandboxLimits(
    cpu_time_s=60, memory_bytes=2 * 2**30, wall_time_s=120.0, max_output_bytes=2**20
)

_BOOT = (
    "import sys; sys.path[:0] = sys.argv[1:]; "
    "from execution_loop.verification import child_main; child_main()"
)


class VerificationError(RuntimeError):
    """The verifier could not reach a verdict (crashed, ran out of time): infrastructure."""


@dataclass(frozen=True)
class VerifierRequest:
    """One episode to verify: which verifier, and the record it judges."""

    verifier: str  # "execution_loop.environments.<module>:<function>"
    payload: dict[str, Any]


def run_verifier(
    request: VerifierRequest,
    *,
    limits: SandboxLimits = DEFAULT_LIMITS,
    sandbox: SandboxBackend | None = None,
) -> Outcome:
    """Run one verifier in a fresh interpreter and return its verdict."""
    return run_verifiers([request], limits=limits, sandbox=sandbox)[0]


def run_verifiers(
    requests: Sequence[VerifierRequest],
    *,
    limits: SandboxLimits = DEFAULT_LIMITS,
    sandbox: SandboxBackend | None = None,
) -> list[Outcome]:
    """Verify a batch of episodes in one fresh interpreter (one start-up for all)."""
    if not requests:
        return []
    search = [str(PROJECT_ROOT)]
    for request in requests:
        for folder in _check_reference(request.verifier):
            if folder not in search:
                search.append(folder)
    packages = _installed_imports(requests, search)
    document = {
        "requests": [dataclasses.asdict(r) for r in requests],
        "packages": packages,
    }
    runner = sandbox or LocalProcessSandbox()
    command = [sys.executable, "-I", "-S", "-B", "-c", _BOOT, *search]
    # A sandbox that hides the filesystem shows the verifier its own code, read-only,
    # and the folders of the installed packages it declared.
    exposed = [Path(folder) for folder in [*search, *sorted(set(packages.values()))]]
    result = runner.run(command, limits=limits, stdin=json.dumps(document), expose=exposed)
    names = sorted({r.verifier for r in requests})
    if result.limit_exceeded or result.exit_code != 0:
        why = result.limit_exceeded or f"exit code {result.exit_code}"
        raise VerificationError(f"verifier {names} failed ({why}): {result.stderr[-2000:]}")
    try:
        verdicts = json.loads(result.stdout)
        outcomes = [
            Outcome(success=bool(v["success"]), reward=float(v["reward"]), details=v["details"])
            for v in verdicts
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise VerificationError(f"verifier {names} returned no verdict: {exc}") from exc
    if len(outcomes) != len(requests):
        raise VerificationError(
            f"verifier {names} returned {len(outcomes)} verdicts for {len(requests)} episodes"
        )
    return outcomes


def _check_reference(verifier: str) -> list[str]:
    """Refuse a verifier outside our environments and installed plugins; its extra path."""
    module, _, function = verifier.partition(":")
    if function.isidentifier():
        if module.startswith(VERIFIER_PACKAGE):
            return []
        folders = plugin_search_path(module)
        if folders:
            return folders
    raise ValueError(
        "verifier must be 'execution_loop.environments.<module>:<fn>' or live in an installed "
        f"environment plugin's package, got {verifier!r}"
    )


def _installed_imports(
    requests: Sequence[VerifierRequest], search: Sequence[str]
) -> dict[str, str]:
    """Top-level name -> folder of the installed packages the verifier modules declare."""
    names: list[str] = []
    for module in sorted({r.verifier.partition(":")[0] for r in requests}):
        path = module_file(module, search)
        if path is not None:
            names += [n for n in declared_distributions(path) if n not in names]
    return _imports_of(tuple(sorted(names))) if names else {}


@cache
def _imports_of(distributions: tuple[str, ...]) -> dict[str, str]:
    """Resolved once per process: the installed packages do not change under a worker."""
    return verifier_imports(distributions).packages


class _DeclaredPackages(importlib.abc.MetaPathFinder):
    """Finds only the declared top-level packages, each in its own installed folder."""

    def __init__(self, packages: Mapping[str, str]) -> None:
        self._packages = dict(packages)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        folder = self._packages.get(fullname) if path is None else None
        if folder is None:
            return None  # a submodule: found through its package's __path__ as usual
        return importlib.machinery.PathFinder.find_spec(fullname, [folder], target)


def resolve(verifier: str) -> Callable[[dict[str, Any]], Outcome]:
    """Import a verifier function from its ``module:function`` reference.

    Inside the verifier interpreter the parent already checked the reference.
    """
    module_name, _, function = verifier.partition(":")
    target = getattr(importlib.import_module(module_name), function)
    if not callable(target):
        raise TypeError(f"{verifier} is not callable")
    return target  # type: ignore[no-any-return]


def child_main() -> None:
    """Entry point inside the verifier process: JSON request on stdin, verdict on stdout."""
    try:
        document = json.loads(sys.stdin.read())
        packages = document.get("packages") or {}
        if packages:
            sys.meta_path.append(_DeclaredPackages(packages))
        # What a verifier or a package it imports prints goes to stderr: stdout is the
        # verdicts' channel, and a stray line would make them unreadable.
        verdict_channel, sys.stdout = sys.stdout, sys.stderr
        verdicts = [
            dataclasses.asdict(resolve(str(r["verifier"]))(dict(r["payload"])))
            for r in document["requests"]
        ]
        verdict_channel.write(json.dumps(verdicts, sort_keys=True))
    except Exception:  # report any failure on stderr; the parent raises VerificationError
        traceback.print_exc()
        sys.exit(1)
