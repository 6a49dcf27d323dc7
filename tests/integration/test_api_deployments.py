"""Deployments, rollback through governance's workflow, and production episodes.

Rollback and episodes are started on this test's governance and execution queues,
where stand-ins registered under the real names answer (the loops' workers are
not what these tests are about).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import Engine, text
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.factories import insert, make_checkpoint, make_task, uid
from tests.factories_web import Person, assert_problem, make_deployment
from triloop.config import Settings
from triloop.temporal import connect
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    GOVERNANCE_QUEUE,
    ROLLBACK_WORKFLOW,
    ROLLOUT_WORKFLOW,
    RollbackInput,
    RollbackResult,
    RolloutBatchInput,
    RolloutBatchResult,
)

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


@workflow.defn(name=ROLLBACK_WORKFLOW)
class StandInRollback:
    """Answers with the decision id it was sent (writes nothing)."""

    @workflow.run
    async def run(self, request: RollbackInput) -> RollbackResult:
        return RollbackResult(alias=request.alias, checkpoint_id="stand-in",
                              previous_checkpoint_id=request.decision_id)


@workflow.defn(name=ROLLOUT_WORKFLOW)
class StandInRollout:
    """Returns at once with the batch's purpose in its id."""

    @workflow.run
    async def run(self, batch: RolloutBatchInput) -> RolloutBatchResult:
        return RolloutBatchResult(batch_id=f"{batch.purpose}:{len(batch.items)}")


@pytest_asyncio.fixture(loop_scope="session")
async def loops(web_settings: Settings) -> AsyncIterator[Client]:
    client = await connect(web_settings, identity="test-loop-stand-ins", service="governance")
    execution = await connect(web_settings, identity="test-loop-stand-ins", service="execution")
    async with Worker(client, task_queue=web_settings.task_queue(GOVERNANCE_QUEUE),
                      workflows=[StandInRollback], workflow_runner=UnsandboxedWorkflowRunner()), \
            Worker(execution, task_queue=web_settings.task_queue(EXECUTION_QUEUE),
                   workflows=[StandInRollout], workflow_runner=UnsandboxedWorkflowRunner()):
        yield client


def _alias(engine: Engine, with_target: bool = True) -> tuple[str, str, str]:
    alias = uid("alias-").lower()
    current, target = make_checkpoint(engine), make_checkpoint(engine)
    make_deployment(engine, alias, current, target if with_target else None)
    return alias, current, target


async def test_deployments_are_listed_with_history(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person]
) -> None:
    alias, current, target = _alias(owner_engine)
    detail = await api.get(f"/api/deployments/{alias}", headers=people["engineer"].headers)
    assert detail.status_code == 200
    assert detail.json()["checkpoint_id"] == current
    assert detail.json()["rollback_target_id"] == target
    listing = await api.get("/api/deployments?limit=200", headers=people["operator"].headers)
    assert alias in [d["alias"] for d in listing.json()["items"]]
    routing = await api.get("/api/routing", headers=people["auditor"].headers)
    assert routing.status_code == 200 and "items" in routing.json()


async def test_operator_rolls_back_through_governance(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person], loops: Client
) -> None:
    alias, current, target = _alias(owner_engine)
    operator = people["operator"]
    response = await api.post("/api/rollback", headers=operator.headers,
                              json={"alias": alias, "reason": "p99 regression"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["alias"] == alias and body["checkpoint_id"] == "stand-in"
    # The workflow was sent the id of the decision the web role recorded, nothing else.
    with owner_engine.connect() as conn:
        row = conn.execute(text(
            "SELECT kind, subject, decision, user_name, comment, recorded_by FROM human_decision"
            " WHERE id = :i"), {"i": body["previous_checkpoint_id"]}).one()
    assert tuple(row) == ("rollback", alias, "rollback", operator.name, "p99 regression",
                          "triloop_web")
    assert body["workflow_id"].startswith(f"rollback-{alias}-")
    again = await api.post("/api/rollback", headers=operator.headers,
                           json={"alias": alias, "reason": "again"})
    assert again.status_code == 200 and again.json()["workflow_id"] != body["workflow_id"]


async def test_rollback_refusals(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person]
) -> None:
    alias, _, _ = _alias(owner_engine)
    for who in ("auditor", "engineer", "admin"):
        response = await api.post("/api/rollback", headers=people[who].headers,
                                  json={"alias": alias, "reason": "nope"})
        assert_problem(response, 403, "rollback")
    operator = people["operator"].headers
    assert_problem(await api.post("/api/rollback", headers=operator,
                                  json={"alias": "no-such-alias", "reason": "x"}), 404)
    bare, _, _ = _alias(owner_engine, with_target=False)
    assert_problem(await api.post("/api/rollback", headers=operator,
                                  json={"alias": bare, "reason": "x"}), 409, "no rollback target")
    assert_problem(await api.post("/api/rollback", headers=operator, json={"alias": alias}),
                   422, "reason")
    assert_problem(await api.post("/api/rollback", headers=operator,
                                  json={"alias": "Not An Alias!", "reason": "x"}), 422, "alias")


async def test_production_episodes_refusals(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person]
) -> None:
    task = make_task(owner_engine)
    for who in ("engineer", "auditor"):
        response = await api.post("/api/episodes", headers=people[who].headers,
                                  json={"items": [{"task_id": task}]})
        assert_problem(response, 403)
    for body in ({"items": []}, {"items": [{"task_id": task, "group_size": 0}]}, {}):
        response = await api.post("/api/episodes", headers=people["operator"].headers, json=body)
        assert_problem(response, 422)


async def test_operator_starts_production_episodes(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person], loops: Client,
    web_settings: Settings,
) -> None:
    task = make_task(owner_engine)
    response = await api.post("/api/episodes", headers=people["operator"].headers,
                              json={"items": [{"task_id": task, "seed": 3, "group_size": 2}]})
    assert response.status_code == 202, response.text
    started = response.json()
    assert started["purpose"] == "production" and started["episodes"] == 2
    execution = await connect(web_settings, identity="test-eyes", service="execution")
    result = await execution.get_workflow_handle(started["workflow_id"]).result()
    assert result["batch_id"] == "production:1"
    unknown = await api.post("/api/episodes", headers=people["operator"].headers,
                             json={"items": [{"task_id": "no-such-task"}]})
    assert_problem(unknown, 422, "no such task")


def _rolled_back_alias(engine: Engine) -> tuple[str, dict[str, str]]:
    """Z bootstrapped, A bootstrapped, B promoted, the watch rolled B back to A."""
    alias = uid("alias-").lower()
    ids = {name: make_checkpoint(engine) for name in "ZAB"}
    insert(engine, "deployment", alias=alias, checkpoint_id=ids["A"],
           rollback_target_id=ids["Z"], updated_by="governance")
    moves = [("bootstrap", "Z", None, "gov-admin", "bootstrap production"),
             ("bootstrap", "A", "Z", "gov-admin", "bootstrap production"),
             ("promote", "B", "A", "governance", "promotion p1 approved by olga"),
             ("rollback", "A", "B", "governance", "rollback [w]: watch: regressed")]
    for kind, checkpoint, previous, actor, reason in moves:
        insert(engine, "deployment_history", alias=alias, checkpoint_id=ids[checkpoint],
               previous_checkpoint_id=ids[previous] if previous else None, kind=kind,
               actor=actor, reason=reason)
    return alias, ids


def _alias_state(engine: Engine, alias: str) -> tuple[object, ...]:
    with engine.connect() as conn:
        return (conn.execute(text("SELECT checkpoint_id, rollback_target_id, updated_at FROM "
                                  "deployment WHERE alias = :a"), {"a": alias}).one(),
                conn.execute(text("SELECT count(*) FROM deployment_history WHERE alias = :a"),
                             {"a": alias}).scalar_one())


async def test_rollback_preview_skips_the_rolled_back_candidate_and_changes_nothing(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person]
) -> None:
    alias, ids = _rolled_back_alias(owner_engine)
    before = _alias_state(owner_engine, alias)
    operator = people["operator"].headers
    preview = await api.get(f"/api/deployments/{alias}/rollback-preview", headers=operator)
    assert preview.status_code == 200, preview.text
    body = preview.json()
    assert body["current_checkpoint_id"] == ids["A"] and body["refusal"] is None
    assert body["target"]["revision"] == 1 and body["target"]["checkpoint_id"] == ids["Z"]
    assert (body["target"]["actor"], body["target"]["reason"]) == ("gov-admin",
                                                                   "bootstrap production")
    states = {r["revision"]: (r["checkpoint_id"], r["rolled_back_at"], r["serving"])
              for r in body["history"]}
    assert states == {4: (ids["A"], None, True), 3: (ids["B"], 4, False),
                      2: (ids["A"], None, True), 1: (ids["Z"], None, False)}
    for query in ("to_revision=3", f"to_checkpoint_id={ids['B']}"):
        refused = await api.get(f"/api/deployments/{alias}/rollback-preview?{query}",
                                headers=operator)
        assert_problem(refused, 409, "rolled back at revision 4", "new promotion")
    assert_problem(await api.get(f"/api/deployments/{alias}/rollback-preview?to_revision=2"
                                 f"&to_checkpoint_id={ids['Z']}", headers=operator), 422)
    # Anyone who may read deployments may preview; nobody changed anything.
    reader = await api.get(f"/api/deployments/{alias}/rollback-preview",
                           headers=people["auditor"].headers)
    assert reader.status_code == 200
    assert _alias_state(owner_engine, alias) == before


async def test_rollback_to_a_rolled_back_revision_is_refused(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person]
) -> None:
    alias, ids = _rolled_back_alias(owner_engine)
    before = _alias_state(owner_engine, alias)
    operator = people["operator"].headers
    for named in ({"to_revision": 3}, {"to_checkpoint_id": ids["B"]}):
        refused = await api.post("/api/rollback", headers=operator,
                                 json={"alias": alias, "reason": "bring B back", **named})
        assert_problem(refused, 409, f"checkpoint {ids['B']}", "rolled back at revision 4")
    both = await api.post("/api/rollback", headers=operator, json={
        "alias": alias, "reason": "x", "to_revision": 1, "to_checkpoint_id": ids["Z"]})
    assert_problem(both, 422, "not both")
    assert _alias_state(owner_engine, alias) == before
    with owner_engine.connect() as conn:
        asked = conn.execute(text(
            "SELECT count(*) FROM audit_event WHERE action = 'rollback' AND decision = 'allow' "
            "AND resource->>'id' = :a AND actor->>'user' = :u"),
            {"a": alias, "u": people["operator"].name}).scalar_one()
    assert asked == 2  # both refusals were authorized (and audited) first
