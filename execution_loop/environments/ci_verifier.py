"""The fix_ci_failure verifier: the pinned suite, run on the agent's code, in its own process.

It rebuilds the pinned repository from the fixture (and refuses if the commit hash
differs), runs the pinned CI there for the baseline, then builds a candidate tree from
the agent's working copy with the pinned tests and runner put back, and runs every test
(skips are ignored and counted as new failures). The criteria come from the contract:
``all_tests_pass``, ``no_new_failures`` and ``coverage_drop_lt`` (line coverage of the
code outside ``tests/``, as a fraction).

Stdlib only at run time (imported without site-packages).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from execution_loop.environments import ci_repo
from execution_loop.environments.base import Outcome
from execution_loop.sandbox import LocalProcessSandbox, SandboxLimits


def verify(payload: dict[str, Any]) -> Outcome:
    """Score the working copy in ``payload['workdir']`` against the contract's criteria."""
    workdir = Path(payload["workdir"])
    limits = SandboxLimits(**payload["limits"])
    sandbox = LocalProcessSandbox()
    scratch = Path(tempfile.mkdtemp(prefix="triloop-verify-ci-"))
    try:
        pinned = scratch / "pinned"
        commit = ci_repo.build_repository(Path(payload["fixture"]), pinned)
        if commit != payload["commit"]:
            raise ci_repo.FixtureError(
                f"fixture builds {commit}, contract pins {payload['commit']}"
            )
        baseline = ci_repo.run_ci(sandbox, pinned, scratch / "baseline.json", limits)
        if baseline.report is None or not baseline.statuses:
            raise ci_repo.FixtureError(f"the pinned CI wrote no report: {baseline.log[-500:]}")
        candidate = scratch / "candidate"
        changed = ci_repo.candidate_tree(workdir, pinned, candidate)
        run = ci_repo.run_ci(sandbox, candidate, scratch / "candidate.json", limits)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    skipped = sorted(set(payload.get("skipped") or []) | set(ci_repo.skipped_tests(workdir)))
    expected = sorted(baseline.statuses)
    failing = [t for t in expected if run.statuses.get(t) != "passed"]
    regressed = {
        t for t in expected if baseline.statuses[t] == "passed" and run.statuses.get(t) != "passed"
    }
    new_failures = sorted(regressed | set(skipped))
    errors = (run.report or {}).get("collection_errors") or []
    drop = ci_repo.coverage(baseline) - ci_repo.coverage(run)

    criteria = payload["criteria"]
    checks: dict[str, bool] = {}
    if criteria.get("all_tests_pass"):
        checks["all_tests_pass"] = run.report is not None and not failing and not errors
    if criteria.get("no_new_failures"):
        checks["no_new_failures"] = run.report is not None and not new_failures
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
        "failing_tests": failing,
        "new_failures": new_failures,
        "skipped_tests": skipped,
        "collection_errors": errors,
        "coverage_baseline": round(ci_repo.coverage(baseline), 6),
        "coverage": round(ci_repo.coverage(run), 6),
        "coverage_drop": round(drop, 6),
        "protected_files_changed": changed,
        "sandbox_limit": run.limit_exceeded,
    }
    reward = terms["success"] if success else terms.get("failure", 0.0)
    return Outcome(success=success, reward=float(reward), details=details)
