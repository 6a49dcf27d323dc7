"""What every governance activity shares: asking OPA, idempotent row ids, audit records."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session
from temporalio import activity
from temporalio.exceptions import ApplicationError

from governance_loop import store
from governance_loop.contracts import GateOutcome
from governance_loop.gates import GateDecision
from governance_loop.gates.promote import PromoteRefused, RunRef, refuse_foreign_run
from triloop.audit import append_event
from triloop.db import session_scope
from triloop.decisions import (
    DecisionRefused,
    HumanDecision,
    audit_refusal,
    current_execution,
    load_decision,
)
from triloop.models import DecisionKind, GateResult, Promotion
from triloop.policy import Actor, Authorizer, PolicyDenied, Resource, acting_for
from triloop.workflow_api import ErrorType

GOVERNANCE = Actor(service="governance")
_ROW_IDS = uuid.UUID("5b0f8c1e-7a55-4c39-9d0e-3f1c2a9e6b71")


def refused(message: str) -> ApplicationError:
    """A non-retryable refusal by a rule of the governance loop itself."""
    return ApplicationError(message, type=ErrorType.GOVERNANCE_REFUSED, non_retryable=True)


def parse_time(value: str) -> datetime:
    """An ISO timestamp from a message."""
    return datetime.fromisoformat(value)


def rfc3339(moment: datetime) -> str:
    """A timestamp as the policy parses it (``time.parse_rfc3339_ns``), in UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def row_id(purpose: str) -> str:
    """A row id fixed by this activity execution, so a retry finds the row it already wrote."""
    try:
        info = activity.info()
        key = f"{info.workflow_run_id}:{info.activity_id}:{purpose}"
    except RuntimeError:  # called outside an activity (tests, the CLI): no retry to dedupe
        return uuid.uuid4().hex
    return uuid.uuid5(_ROW_IDS, key).hex


def calling_run() -> RunRef | None:
    """The workflow run calling this activity, as the server says; None outside one."""
    try:
        info = activity.info()
    except RuntimeError:  # called outside an activity (tests, the CLI)
        return None
    return RunRef(workflow_id=info.workflow_id, run_id=info.workflow_run_id)


def owner_of(promotion: Promotion) -> RunRef:
    """The run a promotion row records as the one that opened it."""
    return RunRef(workflow_id=promotion.workflow_id, run_id=promotion.workflow_run_id)


def run_refused(error: PromoteRefused) -> ApplicationError:
    """A refusal of a promotion rule: never retried; ``details[0]`` names the rule."""
    return ApplicationError(str(error), error.rule, type=ErrorType.PROMOTION_REFUSED,
                            non_retryable=True)


class GovernanceShell:
    """Base of the activity classes: the governance role's engine and the authorizer."""

    def __init__(self, engine: Engine, authorizer: Authorizer) -> None:
        self._engine = engine
        self._authorizer = authorizer

    def own(self, promotion_id: str, action: str) -> None:
        """Refuse (audited) a change to a promotion from a run that did not open it.

        Only ``open_promotion`` starts a run's work on a promotion, and it refuses a second
        run; so a run that reaches any other activity with a promotion it did not open is a
        reset of the run that did: that is recorded as ``workflow_reset`` too (once).
        """
        caller = calling_run()
        with Session(self._engine) as session:
            promotion = session.get(Promotion, promotion_id)
        if promotion is None:
            raise refused(f"promotion {promotion_id} does not exist")
        try:
            refuse_foreign_run(promotion_id, owner=owner_of(promotion), caller=caller)
        except PromoteRefused as error:
            assert caller is not None
            self.refuse_run(promotion.id, owner_of(promotion), caller, action, error)
            raise run_refused(error) from error

    def refuse_run(self, promotion_id: str, owner: RunRef, caller: RunRef, action: str,
                   error: PromoteRefused) -> None:
        """Audit a refused change as a refusal, and the reset that made the run (once)."""
        with session_scope(self._engine) as session:
            if error.rule == "promotion_run" and caller.workflow_id == owner.workflow_id:
                record_reset(session, promotion_id=promotion_id, owner=owner, caller=caller,
                             seen_by=action)
            record_refusal(session, action=action, promotion_id=promotion_id, caller=caller,
                           error=error)

    def prove(
        self, decision_id: str, kind: DecisionKind, subject: str, *, role: str,
        resource: Resource, use: bool = True,
    ) -> HumanDecision:
        """The person's recorded decision, read from the database and marked used by this
        activity execution (committed before it acts; ``use=False``: a step before the one
        that acts on it only reads it); a refusal is audited."""
        try:
            with session_scope(self._engine) as session:
                return load_decision(session, decision_id=decision_id, kind=kind,
                                     subject=subject, role=role,
                                     execution=current_execution() if use else None)
        except DecisionRefused as exc:
            audit_refusal(self._engine, service=GOVERNANCE.service, action=f"{kind}_decision",
                          resource=resource.to_input(), decision_id=decision_id, reason=str(exc))
            raise refused(str(exc)) from exc

    def authorize_for(self, proven: HumanDecision, action: str, resource: Resource) -> None:
        """Ask OPA again, as governance carrying out this person's recorded decision.

        ``on_behalf_of.role_since`` (when the role became active, read from the database
        by ``load_decision``) lets the policy refuse a role newer than what it decides on.
        """
        context = acting_for(proven.person, comment=proven.comment,
                             human_decision_id=proven.id)
        if proven.role_since is not None:
            context["on_behalf_of"]["role_since"] = rfc3339(proven.role_since)
        self.authorize(action, resource, context=context)

    def authorize(
        self, action: str, resource: Resource, *, context: Mapping[str, Any] | None = None
    ) -> None:
        """Ask OPA as the governance service; a denial becomes an ``ApplicationError``."""
        try:
            self._authorizer.authorize(GOVERNANCE, action, resource, context=context)
        except PolicyDenied as denied:
            raise policy_error(denied) from denied


def policy_error(denied: PolicyDenied) -> ApplicationError:
    """Retry when OPA was unreachable (failed closed); never when it said no."""
    reasons = denied.decision.reasons
    if reasons and all(r.startswith("failed closed") for r in reasons):
        return ApplicationError(str(denied), type=ErrorType.POLICY_UNAVAILABLE)
    return ApplicationError(str(denied), type=ErrorType.POLICY_DENIED, non_retryable=True)


def record(
    session: Session, *, action: str, resource: Mapping[str, Any], payload: Mapping[str, Any]
) -> None:
    """Append a governance event (a gate verdict, a move) in the caller's transaction."""
    append_event(
        session,
        actor=GOVERNANCE.to_input(),
        action=action,
        resource=resource,
        decision="record",
        payload=payload,
    )


def store_gate(
    session: Session,
    *,
    promotion_id: str,
    decision: GateDecision,
    threshold_id: str | None = None,
    eval_set_id: str | None = None,
) -> GateOutcome:
    """Write a final gate decision as a ``gate_result`` row plus an audit event."""
    row_key = row_id(f"gate:{decision.gate}")
    existing = session.get(GateResult, row_key)
    row = existing or store.add_gate_result(
        session=session, promotion_id=promotion_id, gate=decision.gate,
        passed=decision.passed, reasons=decision.reasons,
        evidence={**decision.evidence, "verdict": decision.verdict.value},
        threshold_id=threshold_id, eval_set_id=eval_set_id, row_id=row_key,
    )
    if existing is None:
        record(
            session,
            action="gate_result",
            resource={"kind": "promotion", "id": promotion_id},
            payload={
                "gate": decision.gate, "passed": decision.passed,
                "verdict": decision.verdict.value, "reasons": decision.reasons,
                "gate_result_id": row.id, "threshold_id": threshold_id,
                "eval_set_id": eval_set_id,
            },
        )
    return outcome_of(decision, row.id)


def outcome_of(decision: GateDecision, gate_result_id: str | None = None) -> GateOutcome:
    """The workflow's view of a gate decision."""
    return GateOutcome(
        gate=decision.gate, passed=decision.passed, verdict=decision.verdict.value,
        reasons=list(decision.reasons), gate_result_id=gate_result_id,
        restore_routing=decision.restore_routing, rollback=decision.rollback,
    )


def record_refusal(session: Session, *, action: str, promotion_id: str, caller: RunRef | None,
                   error: PromoteRefused) -> None:
    """A refused promotion change on the audit log: ``refuse_<action>``, decision ``deny``."""
    append_event(
        session, actor=GOVERNANCE.to_input(), action=f"refuse_{action}",
        resource={"kind": "promotion", "id": promotion_id}, decision="deny",
        payload={"rule": error.rule, "reason": str(error),
                 "workflow_id": caller.workflow_id if caller else None,
                 "run_id": caller.run_id if caller else None},
    )


def record_reset(session: Session, *, promotion_id: str, owner: RunRef, caller: RunRef,
                 seen_by: str, details: Mapping[str, Any] | None = None) -> None:
    """``workflow_reset`` on the audit log, once per run (``workflow_interruption``)."""
    assert caller.workflow_id is not None and caller.run_id is not None
    payload = {"promotion_id": promotion_id, "workflow_id": caller.workflow_id,
               "run_id": caller.run_id, "promotion_run_id": owner.run_id,
               "seen_by": seen_by, **(details or {})}
    if store.record_interruption(session=session, workflow_id=caller.workflow_id,
                                 run_id=caller.run_id, kind="reset", promotion_id=promotion_id,
                                 details=payload):
        append_event(session, actor=GOVERNANCE.to_input(), action="workflow_reset",
                     resource={"kind": "workflow", "id": caller.workflow_id},
                     decision="record", payload=payload)
