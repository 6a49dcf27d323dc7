"""TrainingRunWorkflow on the real Temporal, PostgreSQL and OPA with the tiny model on CPU.

The learning and execution workers run in-process on queues of each test's own; a
stand-in answers for governance's promotion workflow. Every assertion about what was
stored reads the database.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.worker import Replayer

from learning_loop.store import lineage
from learning_loop.workflows import TrainingRunWorkflow
from tests.factories import record_decision
from tests.factories_learning import (
    frozen_lake_tasks,
    loops_running,
    make_run,
    make_user,
    queue_settings,
    rows,
    run_config,
    start_run,
)
from triloop.config import ServiceName, Settings
from triloop.policy import Actor, PolicyDenied, Resource
from triloop.temporal import DATA_CONVERTER, in_namespace
from triloop.wiring import build_authorizer
from triloop.workflow_api import (
    RUN_CANCEL_SIGNAL,
    RUN_PAUSE_SIGNAL,
    RUN_RESUME_SIGNAL,
    RUN_STATUS_QUERY,
    RunControl,
    RunStatus,
    promotion_workflow_id,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_learning_fixtures"]


@pytest.fixture
def own_settings(settings: Settings) -> Settings:
    """Settings with this test's own task queues."""
    return queue_settings(settings)


async def status_of(handle: Any) -> RunStatus:
    """The run's status query."""
    result: RunStatus = await handle.query(RUN_STATUS_QUERY, result_type=RunStatus)
    return result


async def until_idle(client: Client, handle: Any) -> None:
    """Until the run has no activity, Nexus operation, child workflow or workflow task in
    flight (counted, not timed; the pytest timeout guards a hang).

    The workflow task counts too: between an activity's completion and the next activity
    it schedules there is only a workflow task, and an iteration may still finish in it.
    So does a Nexus operation: a training batch's rollouts run on the execution loop, and
    an iteration whose batch was in flight when the run paused finishes when it returns.
    """
    while True:
        described = (await handle.describe()).raw_description
        if (not described.pending_activities and not described.pending_children
                and not described.pending_nexus_operations
                and not described.HasField("pending_workflow_task")):
            return
        await asyncio.sleep(0.2)


async def until(handle: Any, check: Callable[[RunStatus], bool]) -> RunStatus:
    """Poll the status query until ``check`` holds. No deadline of its own: how long an
    iteration takes depends on the machine's load, and the pytest timeout guards a hang."""
    while True:
        state = await status_of(handle)
        if check(state):
            return state
        await asyncio.sleep(0.3)


async def test_run_writes_steps_lineage_and_proposals(
    client: Client, own_settings: Settings, owner_engine: Engine, tiny_dir: Path
) -> None:
    alice = make_user(owner_engine)
    tasks = frozen_lake_tasks(owner_engine, [1, 2])
    config = run_config(tiny_dir, tasks, schedule={"iterations": 4, "propose_every": 2})
    run_id = make_run(owner_engine, config, alice)
    async with loops_running(client, own_settings):
        handle = await start_run(client, own_settings, run_id, config, alice,
                                 continue_as_new_every=2)
        result: RunStatus = await handle.result()

    # A tiny model from random weights may alarm (template collapse); such a run says so.
    ended = "completed_with_alarms" if result.alarms_raised else "completed"
    assert (result.status, result.iterations_done) == (ended, 4)
    first_run = client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
    assert (await first_run.describe()).status == WorkflowExecutionStatus.CONTINUED_AS_NEW
    # Both recorded histories replay against today's workflow code (determinism).
    replayer = Replayer(workflows=[TrainingRunWorkflow], data_converter=DATA_CONVERTER)
    for recorded in (first_run, client.get_workflow_handle(handle.id)):
        await replayer.replay_workflow(await recorded.fetch_history())
    run_row = rows(owner_engine, "SELECT * FROM training_run WHERE id = :r", r=run_id)[0]
    assert (run_row["status"], run_row["iterations_done"]) == (ended, 4)

    steps = rows(owner_engine, "SELECT * FROM training_step WHERE run_id = :r ORDER BY iteration",
                 r=run_id)
    assert [s["iteration"] for s in steps] == [1, 2, 3, 4]
    for step in steps:
        assert step["reward_mean"] is not None
        assert step["metrics"]["stability"]["iteration"] == step["iteration"]
        # Sampling is seeded by batch ids that carry a random nonce: an iteration whose every
        # group drew equal rewards has no advantage to learn from, and only then is its
        # update skipped (no loss, no tokens trained).
        if step["within_group_reward_variance"] == 0:
            assert step["loss"] is None and step["trainable_tokens"] == 0
        else:
            assert step["loss"] is not None
            assert step["trainable_tokens"] > 0 and step["entropy"] > 0
    assert any(step["loss"] is not None for step in steps)

    chain = lineage(engine=owner_engine, checkpoint_id=result.latest_checkpoint_id or "")
    root, children = chain[0], chain[1:]
    assert root.id == result.base_checkpoint_id and root.parent_id is None
    assert root.run_id is None and root.base_model == root.id
    assert [c.iteration for c in children] == [1, 2, 3, 4]
    assert [c.id for c in children] == [s["checkpoint_id"] for s in steps]
    version_ids = {r["environment_version_id"] for r in rows(
        owner_engine, "SELECT environment_version_id FROM task WHERE id = ANY(:t)", t=tasks)}
    for number, child in enumerate(children, start=1):
        assert child.run_id == run_id and child.base_model == root.id
        [batch] = child.data["trajectory_batches"]
        assert re.fullmatch(rf"{run_id}-{number}-[0-9a-f]{{12}}", batch)  # with its nonce
        assert set(child.environment_version_ids) == version_ids
        # Retention (the stack's keep_last=3) may have pruned iteration 1's files; its row
        # stays, marked. Every kept checkpoint is a whole, servable directory.
        files = Path(child.artifact_uri.removeprefix("file://"))
        if child.pruned_at is None:
            assert (files / "tokenizer.json").is_file()
        else:
            assert child.iteration == 1 and not files.exists()
            assert child.pruned_rule == f"keep_last=3 of run {run_id}"

    # Overlap with bounded staleness: rollout k+1 ran while update k trained, with the
    # checkpoint before it; continue-as-new after iteration 2 drains the pipeline.
    served = rows(owner_engine, "SELECT batch_id, checkpoint_id, policy_version FROM trajectory "
                  "WHERE run_id = :r GROUP BY 1, 2, 3 ORDER BY 1", r=run_id)
    by_iteration = {int(r["batch_id"].removeprefix(f"{run_id}-").split("-")[0]):
                    (r["checkpoint_id"], r["policy_version"]) for r in served}
    assert by_iteration == {
        1: (root.id, 0), 2: (root.id, 0), 3: (children[1].id, 2), 4: (children[1].id, 2),
    }
    # Each batch was requested by learning, through execution's Nexus handler.
    requested = rows(owner_engine, "SELECT requested_by, recorded_by, purpose FROM rollout_batch "
                     "WHERE run_id = :r", r=run_id)
    assert {(b["requested_by"], b["recorded_by"], b["purpose"]) for b in requested} == {
        ("learning", "triloop_execution", "training")} and len(requested) == 4
    assert [s["metrics"]["update"]["off_policy"]["max_staleness_seen"] for s in steps] == [
        0, 1, 0, 1]

    proposals = rows(owner_engine, "SELECT * FROM proposal WHERE run_id = :r", r=run_id)
    assert sorted(p["checkpoint_id"] for p in proposals) == sorted(
        [children[1].id, children[3].id])
    # The status lists what this workflow run did; continue-as-new came after iteration 2.
    assert result.proposals == [p["id"] for p in proposals
                                if p["checkpoint_id"] == children[3].id]
    for proposal in proposals:
        assert proposal["submitted_by"] == alice
        promotion = in_namespace(client, own_settings, "governance").get_workflow_handle(
            promotion_workflow_id(proposal["id"]))
        opened = await promotion.result()
        assert opened["checkpoint_id"] == proposal["checkpoint_id"]
        assert opened["signals"] == [proposal["id"]]
        assert (await promotion.describe()).workflow_type == "PromotionWorkflow"

    audited = rows(owner_engine, "SELECT action, resource->>'kind' AS kind, count(*) AS n "
                   "FROM audit_event WHERE actor->>'service' = 'learning' AND decision = 'allow' "
                   "AND (resource->>'id' LIKE :r OR resource->'attrs'->>'run_id' = :x) "
                   "GROUP BY 1, 2", r=f"{run_id}%", x=run_id)
    counts = {(a["action"], a["kind"]): a["n"] for a in audited}
    assert counts[("create", "training_step")] == 4
    assert counts[("create", "checkpoint")] >= 4
    assert counts[("propose", "proposal")] == 2


async def test_person_pauses_resumes_and_cancels_own_run(
    client: Client, own_settings: Settings, owner_engine: Engine, tiny_dir: Path,
    role_engine: Callable[[ServiceName], Engine],
) -> None:
    alice, mallory = make_user(owner_engine), make_user(owner_engine)
    web = role_engine("web")
    tasks = frozen_lake_tasks(owner_engine, [3])
    config = run_config(tiny_dir, tasks, rollout={"groups_per_iteration": 1},
                        schedule={"iterations": 40, "propose_every": 40})
    run_id = make_run(owner_engine, config, alice)
    async with loops_running(client, own_settings):
        handle = await start_run(client, own_settings, run_id, config, alice)
        await until(handle, lambda s: s.iterations_done >= 1)

        def control(user: str, action: str, reason: str = "", *,
                    engine: Engine = web) -> RunControl:
            return RunControl(record_decision(
                engine, kind="run_control", subject=run_id, decision=action, user=user,
                comment=reason, owner=owner_engine if engine is web else None))

        await handle.signal(RUN_PAUSE_SIGNAL, control(mallory, "pause", "not mine"))
        refused = await until(handle, lambda s: bool(s.refused_controls))
        assert refused.status == "running" and "only their own runs" in refused.refused_controls[0]
        # Anyone who can reach Temporal can send a signal; only the web role's rows count.
        for forged, why in [(control(alice, "pause", engine=owner_engine), "not by the web"),
                            (RunControl("no-such-decision"), "is recorded"),
                            (control(alice, "cancel"), "asks to cancel, not to pause")]:
            await handle.signal(RUN_PAUSE_SIGNAL, forged)
            seen = await until(handle, lambda s, w=why: any(w in r for r in s.refused_controls))
            assert seen.status == "running"

        await handle.signal(RUN_PAUSE_SIGNAL, control(alice, "pause", "look at metrics"))
        paused = await until(handle, lambda s: s.status == "paused")
        assert paused.paused_reason == f"paused by {alice}: look at metrics"
        await until_idle(client, handle)  # the update in flight (if any) has finished
        held = (await status_of(handle)).iterations_done
        await asyncio.sleep(2)
        assert (await status_of(handle)).iterations_done == held
        row = rows(owner_engine, "SELECT status, status_reason FROM training_run WHERE id = :r",
                   r=run_id)[0]
        assert row["status"] == "paused" and alice in row["status_reason"]

        await handle.signal(RUN_RESUME_SIGNAL, control(alice, "resume"))
        await until(handle, lambda s: s.status == "running" and s.iterations_done > held)
        await handle.signal(RUN_CANCEL_SIGNAL, control(alice, "cancel", "enough"))
        result: RunStatus = await handle.result()

    assert result.status == "cancelled" and result.iterations_done < 40
    row = rows(owner_engine, "SELECT status, iterations_done FROM training_run WHERE id = :r",
               r=run_id)[0]
    assert row["status"] == "cancelled" and row["iterations_done"] == result.iterations_done
    decisions = rows(owner_engine,
                     "SELECT action, decision, payload->'context'->'on_behalf_of'->>'user' AS who "
                     "FROM audit_event WHERE actor->>'service' = 'learning' "
                     "AND resource->>'id' = :r AND action IN ('pause', 'resume', 'cancel') "
                     "ORDER BY seq", r=run_id)
    assert [(d["action"], d["decision"], d["who"]) for d in decisions] == [
        ("pause", "deny", mallory), ("pause", "deny", None), ("pause", "deny", None),
        ("pause", "deny", None), ("pause", "allow", alice), ("resume", "allow", alice),
        ("cancel", "allow", alice)]


async def test_stability_alarm_pauses_until_resumed_or_cancelled(
    client: Client, own_settings: Settings, owner_engine: Engine, tiny_dir: Path,
    role_engine: Callable[[ServiceName], Engine],
) -> None:
    alice = make_user(owner_engine)
    tasks = frozen_lake_tasks(owner_engine, [4])
    # Thresholds that make template collapse fire on every iteration.
    config = run_config(tiny_dir, tasks, rollout={"groups_per_iteration": 1}, stability={
        "pause_on_alarm": True, "retrieval_margin": 1.0, "collapse_min_entropy": 0.0,
        "min_discrimination_prompts": 2}, schedule={"iterations": 5, "propose_every": 5})
    run_id = make_run(owner_engine, config, alice)
    async with loops_running(client, own_settings):
        handle = await start_run(client, own_settings, run_id, config, alice)
        first = await until(handle, lambda s: s.status == "paused")
        assert first.iterations_done == 1 and "template collapse" in (first.paused_reason or "")
        web = role_engine("web")
        await handle.signal(RUN_RESUME_SIGNAL, RunControl(record_decision(
            web, kind="run_control", subject=run_id, decision="resume", user=alice,
            comment="checked", owner=owner_engine)))
        second = await until(handle, lambda s: s.status == "paused" and s.iterations_done == 2)
        assert len(second.alarms) == 2
        await handle.signal(RUN_CANCEL_SIGNAL, RunControl(record_decision(
            web, kind="run_control", subject=run_id, decision="cancel", user=alice,
            owner=owner_engine)))
        result: RunStatus = await handle.result()

    assert (result.status, result.iterations_done) == ("cancelled", 2)
    alarms = rows(owner_engine, "SELECT payload FROM audit_event WHERE action = 'stability_alarm' "
                  "AND resource->>'id' = :r ORDER BY seq", r=run_id)
    assert [a["payload"]["iteration"] for a in alarms] == [1, 2]
    assert all(a["payload"]["kind"] == "template_collapse" for a in alarms)
    steps = rows(owner_engine, "SELECT alarms FROM training_step WHERE run_id = :r", r=run_id)
    assert [s["alarms"] for s in steps] == [["template_collapse"]] * 2
    pauses = rows(owner_engine, "SELECT count(*) AS n FROM audit_event WHERE action = 'pause' "
                  "AND decision = 'allow' AND actor->>'service' = 'learning' "
                  "AND resource->>'id' = :r AND payload->'context'->'on_behalf_of' IS NULL",
                  r=run_id)
    assert pauses[0]["n"] == 2  # the loop paused its own run, twice, without a person


async def test_alarms_reach_the_proposal_and_the_run_ends_completed_with_alarms(
    client: Client, own_settings: Settings, owner_engine: Engine, tiny_dir: Path,
) -> None:
    alice = make_user(owner_engine)
    tasks = frozen_lake_tasks(owner_engine, [5])
    # Template collapse fires on every iteration, the last one included; no pausing, so
    # the run reaches its end, and that end must not read plain "completed".
    config = run_config(tiny_dir, tasks, rollout={"groups_per_iteration": 1}, stability={
        "pause_on_alarm": False, "retrieval_margin": 1.0, "collapse_min_entropy": 0.0,
        "min_discrimination_prompts": 2}, schedule={"iterations": 2, "propose_every": 2})
    run_id = make_run(owner_engine, config, alice)
    async with loops_running(client, own_settings):
        handle = await start_run(client, own_settings, run_id, config, alice)
        result: RunStatus = await handle.result()
        (proposal,) = rows(owner_engine, "SELECT * FROM proposal WHERE run_id = :r", r=run_id)
        promotion = in_namespace(client, own_settings, "governance").get_workflow_handle(
            promotion_workflow_id(proposal["id"]))
        opened = await promotion.result()

    assert (result.status, result.iterations_done, result.alarms_raised) == (
        "completed_with_alarms", 2, 2)
    (run_row,) = rows(owner_engine, "SELECT * FROM training_run WHERE id = :r", r=run_id)
    assert run_row["status"] == "completed_with_alarms"
    assert "2 stability alarm(s)" in run_row["status_reason"]
    assert "iteration 2" in run_row["status_reason"]
    expected = [{"iteration": 1, "kind": "template_collapse"},
                {"iteration": 2, "kind": "template_collapse"}]
    assert proposal["evidence"]["stability_alarms"] == expected
    assert opened["stability_alarms"] == [[a["iteration"], a["kind"]] for a in expected]


async def test_run_on_unadmitted_tasks_is_refused(
    client: Client, own_settings: Settings, owner_engine: Engine, tiny_dir: Path
) -> None:
    alice = make_user(owner_engine)
    admitted = frozen_lake_tasks(owner_engine, [1])
    pending = frozen_lake_tasks(owner_engine, [5], status="pending")
    config = run_config(tiny_dir, [*admitted, *pending, "task-that-does-not-exist"])
    run_id = make_run(owner_engine, config, alice)
    async with loops_running(client, own_settings):
        handle = await start_run(client, own_settings, run_id, config, alice)
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()

    message = str(failure.value.cause)
    assert f"task {pending[0]} is pending, not admitted" in message
    assert "task task-that-does-not-exist does not exist" in message
    assert admitted[0] not in message
    row = rows(owner_engine, "SELECT status, status_reason FROM training_run WHERE id = :r",
               r=run_id)[0]
    assert row["status"] == "failed" and "not admitted" in row["status_reason"]
    assert rows(owner_engine, "SELECT * FROM trajectory WHERE run_id = :r", r=run_id) == []
    assert rows(owner_engine, "SELECT * FROM checkpoint WHERE run_id = :r", r=run_id) == []


@pytest.mark.parametrize(("kind", "sql"), [
    ("threshold", "INSERT INTO threshold DEFAULT VALUES"),
    ("eval_item", "INSERT INTO eval_item DEFAULT VALUES"),
    ("promotion", "INSERT INTO promotion DEFAULT VALUES"),
    ("routing", "UPDATE routing SET share = 1.0"),
])
def test_learning_identity_cannot_touch_what_judges_it(
    settings: Settings, role_engine: Callable[[ServiceName], Engine], kind: str, sql: str
) -> None:
    authorizer = build_authorizer(settings, "learning")
    for action in ("create", "update"):
        with pytest.raises(PolicyDenied) as denied:
            authorizer.authorize(Actor(service="learning"), action, Resource(kind, id="x"))
        assert "learning loop may never" in str(denied.value)
    with pytest.raises(ProgrammingError) as refused, role_engine("learning").begin() as conn:
        conn.execute(text(sql))
    assert "permission denied" in str(refused.value)
