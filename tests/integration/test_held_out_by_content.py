"""Held out by content: two seeds that make the same task are one task (issue 26, item 2).

frozen_lake seeds 43 and 190 draw the same map; fix_ci_failure picks its repository by
``seed % 3``, so seeds 0 and 3 are the same repository. The digests are the environments'
own (``describe``); each pair is refused wherever seeds alone let it through before: an
eval set frozen while a run trains on the twin, a training batch or episode on the twin of
a frozen eval task, and the offline-eval gate, whose evidence records the digest check.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, ProgrammingError
from sqlmodel import Session

from execution_loop.environments.registry import describe_task, load_builtin_contract
from governance_loop.activities.evidence import EvidenceActivities
from governance_loop.contracts import OfflineEvalInput
from governance_loop.evalsets import (
    EvalSetError,
    create_eval_set,
    eval_set_content_hash,
    set_threshold,
)
from tests.factories import insert, make_task, uid
from tests.factories_governance import TEST_SPEC
from tests.factories_web import make_promotion
from triloop.config import Settings
from triloop.held_out import held_out_conflicts, overlaps
from triloop.models import Task
from triloop.wiring import build_authorizer

pytestmark = pytest.mark.integration

Roles = Callable[[str], Engine]
TWINS = {"frozen_lake 43/190": ("frozen_lake", 43, 190),
         "fix_ci_failure 0/3": ("fix_ci_failure", 0, 3)}
PLAN = ("jsonb_build_object(CAST(:i AS text), jsonb_build_object('task_id', CAST(:t AS text), "
        "'seed', 0))")
BATCH = ("INSERT INTO rollout_batch (id, purpose, checkpoint_id, requested_by, task_ids, "
         f"planned_episodes) VALUES (:b, 'training', 'c', 'learning', ARRAY[:t], {PLAN})")


def _run(engine: Engine, sql: str, params: dict[str, Any] | None = None) -> None:
    with engine.begin() as conn:
        conn.execute(text(sql), params or {})


def _version(owner: Engine, environment: str) -> str:
    """A version of a fresh environment named after the built-in it plays."""
    name = uid(f"{environment}-")
    insert(owner, "environment", name=name, description="", created_by="test")
    version_id = uid("sha-")
    insert(owner, "environment_version", id=version_id, environment_name=name, version=1,
           contract={"task": environment}, contract_text="task: x", fixture_hashes={},
           created_by="test")
    return version_id


def _task(owner: Engine, version_id: str, seed: int, digest: str | None,
          item: dict[str, Any] | None = None) -> str:
    task_id = uid("task-")
    with owner.begin() as conn:
        conn.execute(text(
            "INSERT INTO task (id, environment_version_id, seed, status, evidence, item, "
            "content_digest) VALUES (:i, :v, :s, 'admitted', '{}', CAST(:item AS jsonb), :d)"),
            {"i": task_id, "v": version_id, "s": seed, "d": digest,
             "item": None if item is None else json.dumps(item)})
    return task_id


def _twins(owner: Engine, case: str) -> tuple[str, str, str]:
    """Two tasks of one version whose seeds differ and whose content does not: (a, b, digest)."""
    environment, seed_a, seed_b = TWINS[case]
    contract = load_builtin_contract(environment)
    digest = describe_task(contract, seed_a).digest
    assert describe_task(contract, seed_b).digest == digest  # the environment says so
    version_id = _version(owner, environment)
    first, second = (_task(owner, version_id, seed, digest) for seed in (seed_a, seed_b))
    return first, second, digest


def _freeze(owner: Engine, task_id: str) -> str:
    """An eval set of the task, frozen as the owner with its true content hash."""
    set_id = uid("es-")
    insert(owner, "eval_set", id=set_id, name=set_id, version=1, created_by="gov")
    insert(owner, "eval_item", eval_set_id=set_id, ordinal=0, task_id=task_id)
    with Session(owner) as session:
        task = session.get(Task, task_id)
        assert task is not None
        content_hash = eval_set_content_hash(set_id, 1, [task])
    _run(owner, "UPDATE eval_set SET frozen_at = now(), content_hash = :h WHERE id = :s",
         {"s": set_id, "h": content_hash})
    return set_id


@pytest.mark.parametrize("case", list(TWINS))
def test_an_eval_set_is_refused_while_a_run_trains_on_its_twin(
    case: str, owner_engine: Engine, role_engine: Roles, settings: Settings,
) -> None:
    evaluated, trained, digest = _twins(owner_engine, case)
    insert(owner_engine, "training_run", id=uid("run-"), submitted_by="alice", name="t",
           config={"rollout": {"task_ids": [trained]}}, status="running", iterations_done=0)
    with pytest.raises(EvalSetError) as refused:
        create_eval_set(engine=role_engine("governance"),
                        authorizer=build_authorizer(settings, "governance"),
                        name=uid("es-"), task_ids=[evaluated], requested_by="gov-admin")
    assert (f"training task {trained} is the same content (digest {digest}) as eval task "
            f"{evaluated}") in str(refused.value)


@pytest.mark.parametrize("case", list(TWINS))
def test_a_training_batch_on_the_twin_of_a_frozen_eval_task_is_refused(
    case: str, owner_engine: Engine, role_engine: Roles,
) -> None:
    evaluated, trained, digest = _twins(owner_engine, case)
    _freeze(owner_engine, evaluated)
    with Session(owner_engine) as session:  # other tests' eval sets may hold the same map too
        (conflict,) = [c for c in held_out_conflicts(session, [trained])
                       if c.held_task == evaluated]
    assert (conflict.task_id, conflict.held_task, conflict.content_digest) == (
        trained, evaluated, digest)
    assert f"the same content (digest {digest}) as held-out task {evaluated}" in (
        conflict.describe())
    with pytest.raises((ProgrammingError, DBAPIError)) as caught:
        _run(role_engine("execution"), BATCH, {"b": uid("b-"), "t": trained, "i": uid("ep-")})
    assert getattr(caught.value.orig, "sqlstate", None) == "42501"
    assert (f"task {trained} is the same content (digest {digest}) as held-out task "
            f"{evaluated}") in str(caught.value.orig)


@pytest.mark.parametrize("case", list(TWINS))
def test_the_offline_eval_gate_fails_a_run_on_the_twin_and_records_the_digest_check(
    case: str, owner_engine: Engine, role_engine: Roles, settings: Settings,
) -> None:
    gov = role_engine("governance")
    authorizer = build_authorizer(settings, "governance")
    evaluated, trained, digest = _twins(owner_engine, case)
    # Frozen as the owner: other tests' runs may train on the same map, which governance's
    # own freeze would (rightly) refuse.
    eval_set_id = _freeze(owner_engine, evaluated)
    threshold = set_threshold(engine=gov, authorizer=authorizer, name=uid("thr-"),
                              spec=TEST_SPEC, eval_set=eval_set_id, requested_by="gov-admin")
    seeded = make_promotion(owner_engine, submitted_by="sam")
    batch = uid("train-")  # written as the owner: the triggers would refuse a service role
    insert(owner_engine, "rollout_batch", id=batch, purpose="training", run_id=seeded.run_id,
           requested_by="learning")
    insert(owner_engine, "trajectory", id=uid("ep-"), batch_id=batch, task_id=trained,
           run_id=seeded.run_id, checkpoint_id=seeded.root_id, purpose="training",
           group_id="g", status="completed", total_reward=1.0, sample_index=0,
           policy_version=0, success=True, num_steps=1)
    outcome = EvidenceActivities(gov, authorizer).decide_offline_eval(OfflineEvalInput(
        promotion_id=seeded.promotion_id, threshold_id=threshold.id, eval_set_id=eval_set_id,
        candidate_batch_id=uid("batch-"), production_batch_id=None))
    named = (f"training task {trained} is the same content (digest {digest}) as eval task "
             f"{evaluated}")
    assert not outcome.passed and outcome.reasons == [f"not held out: {named}"]
    with owner_engine.connect() as conn:
        evidence = conn.execute(text("SELECT evidence FROM gate_result WHERE id = :g"),
                                {"g": outcome.gate_result_id}).scalar_one()
    assert evidence["held_out"]["overlaps"] == [named]
    assert evidence["held_out"]["content_digests"] == {
        "training_with_digest": 1, "training_without_digest": 0, "eval_with_digest": 1,
        "eval_without_digest": 0, "shared_digests": [digest]}


def test_a_seed_with_another_item_is_another_task(owner_engine: Engine) -> None:
    version_id = _version(owner_engine, "dataset")
    first = _task(owner_engine, version_id, 0, None, {"question": "1+1"})
    second = _task(owner_engine, version_id, 0, None, {"question": "2+2"})
    same = _task(owner_engine, _version_twin(owner_engine, version_id), 0, None,
                 {"question": "1+1"})
    with Session(owner_engine) as session:
        assert overlaps(session=session, training=[second], evaluation=[first]) == []
        (found,) = overlaps(session=session, training=[same], evaluation=[first])
    assert found.describe().endswith(f"seed 0 as eval task {first}")


def _version_twin(owner: Engine, version_id: str) -> str:
    """The next version of ``version_id``'s environment."""
    with owner.connect() as conn:
        name = conn.execute(text("SELECT environment_name FROM environment_version "
                                 "WHERE id = :v"), {"v": version_id}).scalar_one()
    twin = uid("sha-")
    insert(owner, "environment_version", id=twin, environment_name=name, version=2,
           contract={"task": "dataset"}, contract_text="task: x", fixture_hashes={},
           created_by="test")
    return twin


def test_a_task_set_aside_for_traffic_is_held_out_from_training(
    owner_engine: Engine, role_engine: Roles,
) -> None:
    evaluated, trained, digest = _twins(owner_engine, "frozen_lake 43/190")
    with owner_engine.connect() as conn:
        version_id = conn.execute(text("SELECT environment_version_id FROM task WHERE id = :t"),
                                  {"t": evaluated}).scalar_one()
    set_id = uid("").ljust(64, "0")
    insert(owner_engine, "task_set", id=set_id, name=uid("ts-"), version=1,
           environment_version_id=version_id, source_kind="seeds", source={"seeds": [43]},
           split_rule={"by": "list", "traffic": [0]}, created_by="test")
    insert(owner_engine, "task_set_member", task_set_id=set_id, task_id=evaluated, ordinal=0,
           split="traffic", content_digest=digest)
    with Session(owner_engine) as session:  # other tests' sets may hold the same map too
        (conflict,) = [c for c in held_out_conflicts(session, [trained])
                       if c.held_task == evaluated]
        assert held_out_conflicts(session, [make_task(owner_engine)]) == []
    assert conflict.held_by.startswith("the traffic split of task set ")
    assert conflict.content_digest == digest
