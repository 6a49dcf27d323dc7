"""The interruption watch: every reset, termination or cancellation of a promotion, on record.

A terminated workflow runs no code, and a reset one replays what it already did: neither
tells governance anything by itself, and before this watch a reset promotion showed up in
the audit log only as an ordinary ``promote allow``. The governance worker runs
``InterruptionWatch.sweep`` when it starts and then every ``SWEEP_INTERVAL_S``; each sweep
reads the server's visibility and history of ``PromotionWorkflow`` runs in governance's
namespace:

- a run that ended ``TERMINATED``, ``CANCELED`` or ``TIMED_OUT`` is audited as
  ``workflow_terminated`` / ``workflow_cancelled`` / ``workflow_timed_out`` with who did it
  and why (the history's close event); if its promotion is still open and the run owns it,
  the promotion ends ``terminated`` / ``cancelled`` / ``failed`` and its routing claims are
  freed (they would lapse anyway: ``triloop.routing_claims``);
- a run that a reset made (its chain's first run is another run) is audited as
  ``workflow_reset``, with the base run, who reset it and why (the history's
  ``WorkflowTaskFailed`` event of cause ``RESET_WORKFLOW``).

Each (workflow, run, kind) is audited once: ``workflow_interruption``'s key makes the
insert and the audit event happen together or not at all (``store.record_interruption``).
A run governance's own activities already caught as a reset (``GovernanceShell.own``) is
not audited twice. Because the watch reads the server, not the worker's memory, a
termination while the governance worker was down is recorded when it comes back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session, select
from temporalio.api.enums.v1 import WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus

from governance_loop import store
from governance_loop.activity_support import GOVERNANCE, GovernanceShell, owner_of, record_reset
from governance_loop.gates.promote import RunRef, same_run
from triloop.audit import append_event
from triloop.db import session_scope
from triloop.models import Promotion
from triloop.policy import Authorizer, Resource
from triloop.statuses import PromotionStatus
from triloop.workflow_api import PROMOTION_WORKFLOW

log = logging.getLogger(__name__)
SWEEP_INTERVAL_S = 30.0

# How a run ended outside its code -> (interruption kind, the promotion's status then).
ENDINGS: Mapping[WorkflowExecutionStatus, tuple[str, PromotionStatus]] = {
    WorkflowExecutionStatus.TERMINATED: ("terminated", PromotionStatus.terminated),
    WorkflowExecutionStatus.CANCELED: ("cancelled", PromotionStatus.cancelled),
    WorkflowExecutionStatus.TIMED_OUT: ("timed_out", PromotionStatus.failed),
}
_STATUS_WORDS = {WorkflowExecutionStatus.TERMINATED: "Terminated",
                 WorkflowExecutionStatus.CANCELED: "Canceled",
                 WorkflowExecutionStatus.TIMED_OUT: "TimedOut"}


@dataclass
class SweepReport:
    """What one sweep recorded (each entry ``workflow_id/run_id``)."""

    ended: list[str] = field(default_factory=list)
    reset: list[str] = field(default_factory=list)


class InterruptionWatch(GovernanceShell):
    """Reads governance's runs from the server and audits each interruption once."""

    def __init__(self, client: Client, engine: Engine, authorizer: Authorizer) -> None:
        super().__init__(engine, authorizer)
        self._client = client

    async def run_forever(self, interval_s: float = SWEEP_INTERVAL_S) -> None:
        """Sweep now and then every ``interval_s``; a failed sweep is logged and retried."""
        while True:
            try:
                await self.sweep()
            except Exception:  # the next sweep retries; nothing is lost, the server keeps it
                log.exception("interruption sweep failed; retrying in %.0fs", interval_s)
            await asyncio.sleep(interval_s)

    async def sweep(self) -> SweepReport:
        """One pass over the server's promotion runs."""
        report = SweepReport()
        statuses = " OR ".join(f"ExecutionStatus = '{word}'" for word in _STATUS_WORDS.values())
        query = f"WorkflowType = '{PROMOTION_WORKFLOW}' AND ({statuses})"
        async for execution in self._client.list_workflows(query):
            if execution.status in ENDINGS and await self._ended(execution):
                report.ended.append(f"{execution.id}/{execution.run_id}")
        async for execution in self._client.list_workflows(
                f"WorkflowType = '{PROMOTION_WORKFLOW}'"):
            first = execution.raw_info.first_run_id
            if first and first != execution.run_id and await self._reset(execution):
                report.reset.append(f"{execution.id}/{execution.run_id}")
        return report

    def _known(self, execution: WorkflowExecution, kind: str) -> bool:
        with Session(self._engine) as session:
            return store.interruption_recorded(session=session, workflow_id=execution.id,
                                               run_id=execution.run_id, kind=kind)

    async def _ended(self, execution: WorkflowExecution) -> bool:
        assert execution.status is not None
        kind, status = ENDINGS[execution.status]
        if self._known(execution, kind):
            return False
        details = await self._close_details(execution)
        caller = RunRef(workflow_id=execution.id, run_id=execution.run_id)
        with session_scope(self._engine) as session:
            promotion = _promotion_of(session, execution.id)
            owns = promotion is not None and same_run(owner=owner_of(promotion), caller=caller)
            if promotion is not None and owns and promotion.status == PromotionStatus.open:
                self.authorize("update", Resource("promotion", id=promotion.id,
                                                  attrs={"status": status, "gate": None}))
                details["released"] = store.release_claims(
                    session=session, promotion_id=promotion.id, updated_by="governance")
                store.update_promotion(session=session, promotion_id=promotion.id,
                                       status=status, reason=f"workflow {kind}: "
                                       f"{details.get('reason') or 'no reason given'}"[:2000])
                details["promotion_status"] = status.value
            elif promotion is not None:
                details["promotion_status"] = promotion.status
            if not store.record_interruption(
                    session=session, workflow_id=execution.id, run_id=execution.run_id,
                    kind=kind, promotion_id=promotion.id if promotion else None,
                    details=details):
                session.rollback()  # another sweep recorded it first: its changes stand
                return False
            append_event(session, actor=GOVERNANCE.to_input(), action=f"workflow_{kind}",
                         resource={"kind": "workflow", "id": execution.id}, decision="record",
                         payload={"run_id": execution.run_id,
                                  "promotion_id": promotion.id if promotion else None,
                                  **details})
        return True

    async def _reset(self, execution: WorkflowExecution) -> bool:
        if self._known(execution, "reset"):
            return False
        details = await self._reset_details(execution)
        if details is None:  # a continue-as-new chain, not a reset
            return False
        caller = RunRef(workflow_id=execution.id, run_id=execution.run_id)
        with session_scope(self._engine) as session:
            promotion = _promotion_of(session, execution.id)
            if promotion is None:
                stored = store.record_interruption(
                    session=session, workflow_id=execution.id, run_id=execution.run_id,
                    kind="reset", promotion_id=None, details=details)
                if stored:
                    append_event(session, actor=GOVERNANCE.to_input(), action="workflow_reset",
                                 resource={"kind": "workflow", "id": execution.id},
                                 decision="record", payload={"run_id": execution.run_id,
                                                             **details})
                return stored
            record_reset(session, promotion_id=promotion.id, owner=owner_of(promotion),
                         caller=caller, seen_by="watch",
                         details=details)
        return True

    async def _events(self, execution: WorkflowExecution) -> list[HistoryEvent]:
        handle = self._client.get_workflow_handle(execution.id, run_id=execution.run_id)
        return [event async for event in handle.fetch_history_events()]

    async def _close_details(self, execution: WorkflowExecution) -> dict[str, Any]:
        """Who ended the run and why, from its history."""
        closed = execution.close_time
        details: dict[str, Any] = {"closed_at": closed.isoformat() if closed else None}
        for event in await self._events(execution):
            if event.HasField("workflow_execution_terminated_event_attributes"):
                attrs = event.workflow_execution_terminated_event_attributes
                details.update(identity=attrs.identity, reason=attrs.reason)
            elif event.HasField("workflow_execution_cancel_requested_event_attributes"):
                cancel = event.workflow_execution_cancel_requested_event_attributes
                details.update(identity=cancel.identity, reason=cancel.cause)
        return details

    async def _reset_details(self, execution: WorkflowExecution) -> dict[str, Any] | None:
        """The base run, who reset it and why; None when no reset made this run."""
        for event in await self._events(execution):
            if not event.HasField("workflow_task_failed_event_attributes"):
                continue
            failed = event.workflow_task_failed_event_attributes
            if failed.cause == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW:
                return {"base_run_id": failed.base_run_id, "identity": failed.identity,
                        "reason": failed.failure.message, "reset_event_id": event.event_id}
        return None


def _promotion_of(session: Session, workflow_id: str) -> Promotion | None:
    query = select(Promotion).where(Promotion.workflow_id == workflow_id).with_for_update()
    return session.exec(query).first()
