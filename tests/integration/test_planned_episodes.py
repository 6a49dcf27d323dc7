"""Issue 32, route 5: the execution role cannot add evidence to a batch, nor vouch for one.

Governance records its eval batch itself, with the episodes it plans. As the execution
role (its own password), 64 forged successful episodes appended to that batch are refused
by the database, a planned episode cannot be stored twice, and the gate's own query still
counts what was played (16 episodes, 0 successes; on main it counted 80/64). Nor can the
execution role write a batch row saying governance asked, and its Nexus handler accepts
governance's request only against the row governance's own role recorded.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlmodel import Session

from execution_loop.batches import BatchConflict, check_requested_batch
from governance_loop import store
from governance_loop.gate_windows import requested_batch_outcomes
from tests.factories import make_task, uid
from tests.factories_governance import Scene, write_episodes
from triloop.episode_plan import planned_episodes
from triloop.workflow_api import RolloutBatchInput, RolloutItem

pytestmark = pytest.mark.integration


def _eval_batch(scene: Scene) -> RolloutBatchInput:
    """Governance's eval batch of the candidate: 16 episodes on the eval set's two tasks."""
    batch = RolloutBatchInput(
        batch_id=uid("eval-"), purpose="eval", checkpoint_id=scene.world.candidate,
        items=[RolloutItem(task_id=t, seed=s, group_size=8)
               for s, t in enumerate(scene.world.task_ids)])
    with Session(scene.governance) as session:  # as governance's own role records it
        store.record_rollout_batch(session=session, batch=batch)
        session.commit()
    return batch


def _row(batch: RolloutBatchInput, episode_id: str, task_id: str,
         success: bool) -> dict[str, object]:
    return {"id": episode_id, "batch_id": batch.batch_id, "task_id": task_id,
            "checkpoint_id": batch.checkpoint_id, "purpose": "eval",
            "group_id": episode_id.rsplit(":", 1)[0], "success": success}


def _refused(engine: Engine, row: dict[str, object]) -> str:
    with pytest.raises(DBAPIError) as caught:
        write_episodes(engine, [row])
    assert getattr(caught.value.orig, "sqlstate", None) == "42501", caught.value.orig
    return str(caught.value.orig)


def test_forged_episodes_in_governance_eval_batch_are_refused_and_never_counted(
    scene: Scene,
) -> None:
    batch = _eval_batch(scene)
    played = planned_episodes(batch)
    write_episodes(scene.execution, [_row(batch, e.episode_id, e.task_id, False) for e in played],
                   verifier=scene.verifier)
    task = scene.world.task_ids[0]
    # 64 forged successes: fresh ids the plan never named (a third item, or more samples).
    forged = [f"{batch.batch_id}:{2 + i // 8}:{i % 8}" for i in range(32)] + [
        f"{batch.batch_id}:0:{8 + i}" for i in range(32)]
    for episode_id in forged:
        assert "not an episode batch" in _refused(scene.execution, _row(batch, episode_id,
                                                                       task, True))
    # A planned episode is stored once: a second success under its id is refused too.
    with pytest.raises(IntegrityError), scene.execution.begin() as conn:
        conn.execute(text(
            "INSERT INTO trajectory (id, batch_id, task_id, checkpoint_id, purpose, group_id, "
            "sample_index, policy_version, status, success, total_reward, num_steps) VALUES "
            "(:i, :b, :t, :c, 'eval', 'g', 0, 0, 'completed', true, 1.0, 1)"),
            {"i": played[0].episode_id, "b": batch.batch_id, "t": played[0].task_id,
             "c": batch.checkpoint_id})
    with Session(scene.governance) as session:
        counted = requested_batch_outcomes(session=session, batch_id=batch.batch_id,
                                           checkpoint_id=scene.world.candidate)
    assert (len(counted.outcomes.successes), sum(counted.outcomes.successes)) == (16, 0)
    assert counted.problems == []


def test_execution_cannot_vouch_that_governance_asked(scene: Scene) -> None:
    batch_id = uid("eval-")
    plan = json.dumps({f"{batch_id}:0:0": {"task_id": "t", "seed": 0}})
    with pytest.raises(DBAPIError) as caught, scene.execution.begin() as conn:
        conn.execute(text(
            "INSERT INTO rollout_batch (id, purpose, checkpoint_id, requested_by, "
            "planned_episodes) VALUES (:b, 'eval', :c, 'governance', CAST(:p AS jsonb))"),
            {"b": batch_id, "c": scene.world.candidate, "p": plan})
    assert getattr(caught.value.orig, "sqlstate", None) == "42501"
    assert "governance and the web service record their own" in str(caught.value.orig)


def test_the_handler_takes_governance_request_only_against_governance_own_row(
    scene: Scene,
) -> None:
    recorded = _eval_batch(scene)
    check_requested_batch(engine=scene.execution, batch=recorded, requested_by="governance")
    # Asked for more than governance recorded: refused before any episode runs.
    bigger = RolloutBatchInput(batch_id=recorded.batch_id, purpose="eval",
                               checkpoint_id=recorded.checkpoint_id,
                               items=[*recorded.items, RolloutItem(scene.world.task_ids[0], 9, 64)])
    with pytest.raises(BatchConflict, match="80 planned episodes"):
        check_requested_batch(engine=scene.execution, batch=bigger, requested_by="governance")
    # A row that says governance asked but was not written by governance's role.
    planted = RolloutBatchInput(batch_id=uid("eval-"), purpose="eval",
                                checkpoint_id=scene.world.candidate, items=recorded.items)
    with Session(scene.owner) as session:
        store.record_rollout_batch(session=session, batch=planted)
        session.commit()
    with pytest.raises(BatchConflict, match="was requested by governance"):
        check_requested_batch(engine=scene.execution, batch=planted, requested_by="governance")
    unrecorded = RolloutBatchInput(batch_id=uid("eval-"), purpose="eval",
                                   checkpoint_id=scene.world.candidate, items=recorded.items)
    with pytest.raises(BatchConflict, match="records its own batch"):
        check_requested_batch(engine=scene.execution, batch=unrecorded, requested_by="governance")


def test_only_the_verifier_writes_verdicts(scene: Scene, role_engine: Any) -> None:
    # A training episode: the running verifier judges none, so this test writes its verdict.
    # On a task of its own: training on the eval set's is refused (0022).
    batch_id = uid("train-")
    episode_id = f"{batch_id}:0:0"
    write_episodes(scene.execution, [{
        "id": episode_id, "batch_id": batch_id, "task_id": make_task(scene.owner),
        "checkpoint_id": scene.world.candidate, "purpose": "training",
        "group_id": f"{batch_id}:0", "success": False}], requester=scene.owner)
    verdict = ("INSERT INTO verdict (trajectory_id, batch_id, success, total_reward, agrees) "
               "VALUES (:t, :b, true, 1.0, true)")
    params = {"t": episode_id, "b": batch_id}
    for role in ("execution", "governance", "web", "learning"):
        with pytest.raises(DBAPIError) as caught, role_engine(role).begin() as conn:
            conn.execute(text(verdict), params)
        assert getattr(caught.value.orig, "sqlstate", None) == "42501", role
    with pytest.raises(DBAPIError, match="inserting role"), scene.verifier.begin() as conn:
        conn.execute(text(verdict.replace("agrees)", "agrees, recorded_by)").replace(
            "true)", "true, 'triloop_execution')")), params)
    with scene.verifier.begin() as conn:
        conn.execute(text(verdict), params)
    with pytest.raises(DBAPIError, match="permission denied"), scene.verifier.begin() as conn:
        conn.execute(text("UPDATE verdict SET success = false WHERE trajectory_id = :t"), params)
