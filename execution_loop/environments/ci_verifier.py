"""The fix_ci_failure verifier: the pinned tests, run by the verifier, on the agent's code.

It runs in its own interpreter (``execution_loop.verification``) and trusts nothing the
agent's CI printed or wrote. It rebuilds the pinned repository from the fixture (and
refuses if the commit hash differs), runs the pinned suite there for the baseline, then
builds a candidate tree from the agent's working copy with the pinned tests and runner
put back and every file that loads itself (``conftest.py``, pytest and setup config,
``sitecustomize``, ``.pth``) removed, and runs the pinned suite on it with
``ci_suite.run_pinned_suite``: pytest in a fresh process, its verdict read from the exit
status and a JUnit XML file in a folder beside a copy of the tree made for that run, both
of which must agree. pytest runs under the episode's sandbox backend (``payload["sandbox"]``:
bubblewrap, or local) with the worker's package folders (``payload["dependencies"]``)
exposed read-only; this process, triloop's own code, runs outside it.
Every skip counts as a new failure; a run whose harness the code under test changed
(``tampering``) fails whatever its tests say. The criteria come from the contract:
``all_tests_pass``, ``no_new_failures`` and ``coverage_drop_lt`` (line coverage of the
code outside ``tests/``, as a fraction).

Stdlib only at run time (imported without site-packages).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from execution_loop.environments import ci_repo, ci_suite
from execution_loop.environments.base import Outcome
from execution_loop.sandbox import LocalProcessSandbox, SandboxBackend, SandboxLimits
from execution_loop.sandboxes import BubblewrapSandbox


def suite_sandbox(backend: str) -> SandboxBackend:
    """Where the pinned suite runs the agent's code: the backend its episode ran in.

    Bubblewrap only where the episode's own sandbox was bubblewrap (the worker checked
    that it works); the verifier never falls back silently to a weaker one than asked.
    """
    if backend == "bubblewrap":
        return BubblewrapSandbox()
    if backend == "local":
        return LocalProcessSandbox()
    raise ValueError(f"the verifier runs the suite under bubblewrap or locally, not {backend!r}")


def verify(payload: dict[str, Any]) -> Outcome:
    """Score the working copy in ``payload['workdir']`` against the contract's criteria."""
    workdir = Path(payload["workdir"])
    limits = SandboxLimits(**payload["limits"])
    sandbox = suite_sandbox(str(payload.get("sandbox") or "local"))
    expose = tuple(Path(folder) for folder in payload.get("dependencies") or ())
    scratch = Path(tempfile.mkdtemp(prefix="triloop-verify-ci-"))
    try:
        pinned = scratch / "pinned"
        commit = ci_repo.build_repository(Path(payload["fixture"]), pinned)
        if commit != payload["commit"]:
            raise ci_repo.FixtureError(
                f"fixture builds {commit}, contract pins {payload['commit']}"
            )
        expected = ci_suite.pinned_tests(pinned)
        baseline = ci_suite.run_pinned_suite(
            sandbox, pinned, limits, expected, not_covered=(ci_repo.RUNNER,), expose=expose
        )
        if not baseline.statuses or not baseline.trusted or baseline.limit_exceeded:
            raise ci_repo.FixtureError(
                f"the pinned suite gave no trustworthy baseline ({baseline.tampering}, "
                f"{baseline.limit_exceeded}): {baseline.log[-800:]}"
            )
        candidate = scratch / "candidate"
        changed = ci_repo.candidate_tree(workdir, pinned, candidate)
        run = ci_suite.run_pinned_suite(
            sandbox, candidate, limits, expected, not_covered=(ci_repo.RUNNER,), expose=expose
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    skipped = sorted(set(payload.get("skipped") or []) | set(ci_repo.skipped_tests(workdir)))
    failing = [t for t in sorted(expected) if run.statuses.get(t) != "passed"]
    regressed = {
        t for t in expected if baseline.statuses.get(t) == "passed" and t in failing
    }
    new_failures = sorted(regressed | set(skipped))
    drop = baseline.coverage - run.coverage

    criteria = payload["criteria"]
    checks: dict[str, bool] = {"trusted_result": run.trusted}
    if criteria.get("all_tests_pass"):
        checks["all_tests_pass"] = not failing and not run.collection_errors
    if criteria.get("no_new_failures"):
        checks["no_new_failures"] = not new_failures
    if criteria.get("coverage_drop_lt") is not None:
        checks["coverage_drop_lt"] = drop < float(criteria["coverage_drop_lt"])
    success = run.limit_exceeded is None and all(checks.values())
    if run.limit_exceeded:
        reason = "sandbox_limit"
    else:
        reason = "passed" if success else next(k for k, ok in checks.items() if not ok)
    terms: dict[str, float] = payload["reward"]
    details = {
        "reason": reason,
        "checks": checks,
        "commit": commit,
        "exit_code": run.exit_code,
        "failing_tests": failing,
        "new_failures": new_failures,
        "skipped_tests": skipped,
        "collection_errors": run.collection_errors,
        "tampering": run.tampering,
        "coverage_baseline": round(baseline.coverage, 6),
        "coverage": round(run.coverage, 6),
        "coverage_drop": round(drop, 6),
        "protected_files_changed": changed,
        "sandbox_limit": run.limit_exceeded,
        "suite_sandbox": sandbox.name,
    }
    reward = terms["success"] if success else terms.get("failure", 0.0)
    return Outcome(success=success, reward=float(reward), details=details)
