"""``probe_admission`` gathers honest evidence: real resets, reference runs, verifier process."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine
from temporalio.testing import ActivityEnvironment

from execution_loop.admission_probe import AdmissionProbe
from execution_loop.environments import frozen_lake
from execution_loop.environments.base import Environment, Outcome, fingerprint
from execution_loop.environments.registry import get_environment
from execution_loop.serving import TaskEnvironments
from tests.factories_execution import make_task_on, register_builtin
from triloop.workflow_api import AdmissionProbeEvidence, AdmissionProbeInput

pytestmark = pytest.mark.integration


def probe(engine: Engine, task_id: str, lookup: Callable[[str], Any] | None = None,
          runs: int = 2) -> AdmissionProbeEvidence:
    """Run the activity as the worker would, outside Temporal."""
    activity = AdmissionProbe(environments=TaskEnvironments(engine=engine, lookup=lookup))
    request = AdmissionProbeInput(task_id=task_id, resets=3, reference_runs=runs)
    return ActivityEnvironment().run(activity.probe_admission, request)


@pytest.mark.parametrize("environment", ["frozen_lake", "tool_arithmetic", "fix_ci_failure"])
def test_builtin_environments_give_admissible_evidence(
    role_engine: Callable[[str], Engine], owner_engine: Engine, environment: str
) -> None:
    # Seeds of their own: tasks are shared rows, and other tests admit low seeds.
    task = make_task_on(owner_engine, register_builtin(owner_engine, environment), seed=9002,
                        status="pending")
    evidence = probe(role_engine("execution"), task)
    assert evidence.environment == environment and evidence.seed == 9002
    assert len(evidence.reset_fingerprints) == 3 and len(set(evidence.reset_fingerprints)) == 1
    assert len(evidence.reset_seconds) == 3 and all(t >= 0 for t in evidence.reset_seconds)
    assert evidence.reference_results == [True, True] and evidence.notes == []
    assert evidence.verifier_ran_out_of_process
    assert evidence.verifier_hash is not None and len(evidence.verifier_hash) == 64
    # What the task is, for held out by content: the environment's own description.
    from execution_loop.environments.registry import describe_task, load_builtin_contract

    described = describe_task(load_builtin_contract(environment), 9002)
    assert (evidence.content_digest, evidence.tags) == (described.digest, dict(described.tags))


class DriftingLake(frozen_lake.FrozenLake):
    """Resets differently each time and judges itself in-process: never admissible."""

    _counter = itertools.count()

    def state_fingerprint(self) -> str:
        return fingerprint({"base": super().state_fingerprint(), "n": next(self._counter)})

    def outcome(self) -> Outcome:
        return frozen_lake.verify(self.verifier_request().payload)


def test_unreproducible_resets_and_in_process_verdicts_show_in_the_evidence(
    role_engine: Callable[[str], Engine], owner_engine: Engine
) -> None:
    builtin = get_environment("frozen_lake")

    def drifting(_name: str) -> Callable[..., Environment]:
        def factory(contract: Any = None, **kwargs: Any) -> Environment:
            builtin(contract, **kwargs)  # the contract still checks against the environment
            return DriftingLake(contract, **kwargs)
        return factory

    task = make_task_on(owner_engine, register_builtin(owner_engine, "frozen_lake"), seed=9003,
                        status="pending")
    evidence = probe(role_engine("execution"), task, lookup=drifting)
    assert len(set(evidence.reset_fingerprints)) == 3
    assert evidence.reference_results == [True, True]
    assert not evidence.verifier_ran_out_of_process and evidence.verifier_hash is None
    assert len(evidence.notes) == 2

