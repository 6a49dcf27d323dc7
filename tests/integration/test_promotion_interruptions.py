"""Issue 32, route 3: a reset, terminate or cancel of a promotion moves nothing and is on record.

Real Temporal, PostgreSQL and OPA, driven as ``test_promotion_workflow`` drives promotions.
The reset and the termination use the operator's own Temporal token (cluster admin): the
narrower authorizer may refuse them to the service tokens, and these tests must hold for
whoever still can.
"""
# The promotion fixtures are imported from test_promotion_workflow; tests take them by name.
# ruff: noqa: F811

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.service import TLSConfig

from execution_loop.routing import read_routes
from governance_loop.interruptions import InterruptionWatch, SweepReport
from tests.factories_governance import wait_for
from tests.integration.test_promotion_workflow import (  # noqa: F401  (fixtures)
    TIMING,
    Deps,
    Running,
    _good,
    _production,
    _routing,
    _rows,
    _to_approval,
    authorizer,
    deps,
    gov_settings,
    running,
)
from triloop.temporal import DATA_CONVERTER
from triloop.workflow_api import PROMOTION_APPROVE_UPDATE, promotion_workflow_id

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SLOW_SHADOW = replace(TIMING, shadow_soak_s=3600.0)  # the promotion stays at shadow


async def _operator_admin(deps: Deps) -> Client:
    """A client with the operator's own Temporal token, in governance's namespace."""
    settings = deps.settings
    tls: TLSConfig | bool = False  # as triloop.temporal.connect: the stack's client cert, if any
    if settings.temporal_tls_cert and settings.temporal_tls_key:
        tls = TLSConfig(client_cert=settings.temporal_tls_cert.read_bytes(),
                        client_private_key=settings.temporal_tls_key.read_bytes())
    return await Client.connect(
        settings.temporal_address, namespace=settings.temporal_namespace("governance"),
        identity="operator-admin", api_key=settings.temporal_credential("admin"), tls=tls,
        data_converter=DATA_CONVERTER)


def _promotion(deps: Deps) -> tuple[str, str, str | None]:
    row = _rows(deps.owner, "SELECT id, status, workflow_run_id FROM promotion "
                "WHERE proposal_id = :p", p=deps.world.proposal_id)[0]
    return row[0], row[1], row[2]


def _audit(deps: Deps, action: str, workflow_id: str) -> list[dict[str, Any]]:
    rows = _rows(deps.owner, "SELECT payload FROM audit_event WHERE action = :a AND "
                 "(resource->>'id' = :w OR resource->>'id' = :p) ORDER BY seq",
                 a=action, w=workflow_id, p=_promotion(deps)[0])
    return [dict(r[0]) for r in rows]


async def _sweep_until(deps: Deps, found: str) -> SweepReport:
    """Sweep until the server's visibility shows the run (it lags a close by a moment)."""
    watch = InterruptionWatch(deps.client, deps.gov_engine, deps.authorizer)

    async def swept() -> SweepReport | None:
        report = await watch.sweep()
        return report if any(found in entry for entry in report.ended + report.reset) else None

    report: SweepReport = await wait_for(swept, timeout=60.0, what=f"a sweep to record {found}")
    return report


async def _claimed(run: Running, slot: str) -> None:
    await run.at_gate(slot)
    candidate = run.deps.world.candidate
    await wait_for(lambda: _routing(run.deps).get(slot) == candidate, timeout=60.0,
                   what=f"the {slot} slot to serve the candidate")


async def _ended(handle: Any) -> Any:
    """A run's result; a run that stops making progress fails the test with its history."""
    try:
        return await asyncio.wait_for(handle.result(), timeout=120.0)
    except TimeoutError:
        events = [e async for e in handle.fetch_history_events()]
        stuck = [str(e.workflow_task_failed_event_attributes.failure.message)
                 for e in events if e.HasField("workflow_task_failed_event_attributes")]
        raise AssertionError(f"run {handle.run_id} did not end: {stuck[-3:]}") from None


def _promote_scheduled_at(events: list[HistoryEvent]) -> int:
    """The workflow task that scheduled promote: a reset to it re-runs the promote step."""
    for event in events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled = event.activity_task_scheduled_event_attributes
            if scheduled.activity_type.name == "governance.promote_candidate":
                return scheduled.workflow_task_completed_event_id
    raise AssertionError("the promotion never scheduled promote_candidate")


async def test_a_reset_of_a_rolled_back_promotion_never_moves_production(deps: Deps) -> None:
    world = deps.world
    quality = _good(deps)
    workflow_id = promotion_workflow_id(world.proposal_id)
    async with running(deps, quality) as run:
        await _to_approval(run)
        quality.set(world.candidate, 0.1, purpose="production")  # the watch rolls it back
        await run.decide(PROMOTION_APPROVE_UPDATE, "carol", ["operator"])
        final = await run.result()
        assert final.status == "rolled_back", final.reason
        assert _production(deps)[0] == world.baseline
        first_run = run.handle.result_run_id
        assert first_run and _promotion(deps)[2] == first_run  # the row names its run

        # The attack of issue 32: reset the ended promotion to its promote step.
        admin = await _operator_admin(deps)
        events = [e async for e in run.handle.fetch_history_events()]
        reset = await admin.workflow_service.reset_workflow_execution(
            ResetWorkflowExecutionRequest(
                namespace=admin.namespace,
                workflow_execution=WorkflowExecution(workflow_id=workflow_id, run_id=first_run),
                reason="replay the promotion to its promote step",
                workflow_task_finish_event_id=_promote_scheduled_at(events),
                request_id=uuid.uuid4().hex))
        replayed = deps.client.get_workflow_handle(workflow_id, run_id=reset.run_id)
        with pytest.raises(WorkflowFailureError) as failed:
            await _ended(replayed)
        activity_error = failed.value.cause
        assert isinstance(activity_error, ActivityError)
        refusal = activity_error.cause
        assert isinstance(refusal, ApplicationError) and refusal.type == "PromotionRefused"
        assert refusal.non_retryable and list(refusal.details) == ["promotion_run"]
        assert f"belongs to run {first_run}" in refusal.message

        # Production did not move; the promotion stays as it ended; one promote result.
        assert _production(deps)[0] == world.baseline
        assert _routing(deps)["production"] == world.baseline
        assert _promotion(deps)[1] == "rolled_back"
        promotes = _rows(deps.owner, "SELECT passed FROM gate_result WHERE promotion_id = :p "
                         "AND gate = 'promote'", p=_promotion(deps)[0])
        assert [r[0] for r in promotes] == [True]

        # On record: the reset and the refused promote, never a second promote.
        resets = _audit(deps, "workflow_reset", workflow_id)
        assert [(r["run_id"], r["promotion_run_id"]) for r in resets] == [
            (reset.run_id, first_run)]
        refused = _audit(deps, "refuse_promote", workflow_id)
        assert [(r["rule"], r["run_id"]) for r in refused] == [("promotion_run", reset.run_id)]
        decisions = _rows(deps.owner, "SELECT decision FROM audit_event WHERE action = "
                          "'refuse_promote' AND payload->>'run_id' = :r", r=reset.run_id)
        assert [d[0] for d in decisions] == ["deny"]
        # The watch finds the same reset in the server's history and does not audit it twice.
        await InterruptionWatch(deps.client, deps.gov_engine, deps.authorizer).sweep()
        assert len(_audit(deps, "workflow_reset", workflow_id)) == 1


async def test_a_terminated_promotion_leaves_no_routing_and_is_on_record(deps: Deps) -> None:
    world = deps.world
    workflow_id = promotion_workflow_id(world.proposal_id)
    async with running(deps, _good(deps), SLOW_SHADOW) as run:
        await _claimed(run, "shadow")
        assert read_routes(deps.exec_engine).shadow == world.candidate
        admin = await _operator_admin(deps)
        await admin.get_workflow_handle(workflow_id).terminate(reason="operator stops it")

        # The terminated run ran no code: its claim is stored until it expires, and once
        # expired it serves nothing although no governance process has looked.
        claim = _rows(deps.owner, "SELECT checkpoint_id, claim_expires_at > now() FROM routing "
                      "WHERE slot = 'shadow'")
        assert [tuple(c) for c in claim] == [(world.candidate, True)]
        with deps.owner.begin() as conn:  # the soak and its grace pass
            conn.execute(text("UPDATE routing SET claim_expires_at = now() - interval '1 s' "
                              "WHERE slot = 'shadow'"))
        assert read_routes(deps.exec_engine).shadow is None

        # The governance worker's watch records the termination and ends the promotion.
        await _sweep_until(deps, workflow_id)
        assert _routing(deps)["shadow"] is None
        assert _promotion(deps)[1] == "terminated"
        ended = _audit(deps, "workflow_terminated", workflow_id)
        assert len(ended) == 1, ended
        assert ended[0]["identity"] == "operator-admin"
        assert ended[0]["reason"] == "operator stops it"
        assert ended[0]["released"] == ["shadow"]
        second = await InterruptionWatch(deps.client, deps.gov_engine, deps.authorizer).sweep()
        assert not any(workflow_id in e for e in second.ended)  # audited once
        assert len(_audit(deps, "workflow_terminated", workflow_id)) == 1


async def test_a_cancelled_promotion_frees_its_slot_itself(deps: Deps) -> None:
    world = deps.world
    workflow_id = promotion_workflow_id(world.proposal_id)
    async with running(deps, _good(deps), SLOW_SHADOW) as run:
        await _claimed(run, "shadow")
        admin = await _operator_admin(deps)
        await admin.get_workflow_handle(workflow_id).cancel()
        with pytest.raises(WorkflowFailureError):
            await _ended(run.handle)
        # The workflow's own cleanup ran before it ended: nothing is left to lapse.
        assert _rows(deps.owner, "SELECT checkpoint_id, promotion_id FROM routing "
                     "WHERE slot = 'shadow'")[0][0] is None
        assert _promotion(deps)[1] == "cancelled"
        closed = _audit(deps, "close_promotion", workflow_id)
        assert [(c["status"], c["released"]) for c in closed] == [("cancelled", ["shadow"])]
        await _sweep_until(deps, workflow_id)
        cancelled = _audit(deps, "workflow_cancelled", workflow_id)
        assert len(cancelled) == 1 and cancelled[0]["identity"] == "operator-admin"
