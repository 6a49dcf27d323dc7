"""Audit and approval: validation of a person's decision, and the gate result it makes.

These run in Temporal update validators, so they are pure, fast and raise
``HumanDecisionError`` to refuse. They re-check what OPA already checked before
the web service sent the update: a bug or a bypass of one layer must still meet
the other. Identities are compared after trimming and case-folding, so "Alice"
cannot approve what "alice" submitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from governance_loop.gates.decision import APPROVAL, AUDIT, STABILITY, GateDecision, Verdict

AUDITOR_ROLE = "auditor"
OPERATOR_ROLE = "operator"
# Human decisions reach a workflow only through the web service (after OPA allowed them).
HUMAN_DECISION_SERVICE = "web"


class HumanDecisionError(ValueError):
    """A human decision that the workflow must refuse; the message says why."""


class AuditDecisionKind(StrEnum):
    """What an auditor may decide."""

    SIGN = "sign"
    REJECT = "reject"


class ApprovalDecisionKind(StrEnum):
    """What an operator may decide."""

    APPROVE = "approve"
    REJECT = "reject"


class AlarmOverrideKind(StrEnum):
    """What an operator may decide about a candidate blocked by its run's alarms."""

    OVERRIDE = "override"


@dataclass(frozen=True)
class HumanDecision:
    """A person's decision as the web service forwards it in a Temporal update."""

    # The signed-in person; None when the caller is a service acting on its own.
    user: str | None
    # The service that sent the update: must be the web service.
    service: str
    roles: list[str]
    # "sign"/"reject" for an audit, "approve"/"reject" for an approval.
    decision: str
    comment: str | None


def _identity(name: str) -> str:
    return name.strip().casefold()


def _check_common(
    decision: HumanDecision, *, gate: str, awaiting: str, role: str, allowed: type[StrEnum]
) -> str:
    """Checks shared by audit and approval; returns the decider's normalised identity."""
    if awaiting != gate:
        raise HumanDecisionError(
            f"this promotion is at gate {awaiting!r}, not {gate!r}: the {gate} decision "
            "cannot be taken now"
        )
    if decision.service != HUMAN_DECISION_SERVICE:
        raise HumanDecisionError(
            f"{gate} decisions come from people through the web service; "
            f"service {decision.service!r} may not take one"
        )
    if decision.user is None or not decision.user.strip():
        raise HumanDecisionError(f"a {gate} decision needs the signed-in user who takes it")
    if role not in decision.roles:
        raise HumanDecisionError(
            f"user {decision.user!r} lacks the {role!r} role needed for the {gate} decision "
            f"(has {sorted(decision.roles)})"
        )
    choices = [kind.value for kind in allowed]
    if decision.decision not in choices:
        raise HumanDecisionError(
            f"unknown {gate} decision {decision.decision!r}; expected one of {choices}"
        )
    if decision.comment is None or not decision.comment.strip():
        raise HumanDecisionError(f"a {gate} decision needs a comment saying why")
    return _identity(decision.user)


def validate_audit_decision(decision: HumanDecision, *, submitter: str, awaiting: str) -> None:
    """Refuse an audit sign-off or rejection that breaks the rules; return None if valid."""
    auditor = _check_common(
        decision, gate=AUDIT, awaiting=awaiting, role=AUDITOR_ROLE, allowed=AuditDecisionKind
    )
    if auditor == _identity(submitter):
        raise HumanDecisionError(
            f"separation of duties: {decision.user!r} submitted the training run and "
            "cannot audit its candidate; another auditor must sign"
        )


def validate_approval_decision(
    decision: HumanDecision, *, submitter: str, auditor: str | None, awaiting: str
) -> None:
    """Refuse an approval or rejection that breaks the rules; return None if valid."""
    approver = _check_common(
        decision,
        gate=APPROVAL,
        awaiting=awaiting,
        role=OPERATOR_ROLE,
        allowed=ApprovalDecisionKind,
    )
    if auditor is None or not auditor.strip():
        raise HumanDecisionError("no signed audit: an auditor must sign before approval")
    if approver == _identity(submitter):
        raise HumanDecisionError(
            f"separation of duties: {decision.user!r} submitted the training run and "
            "cannot approve its candidate; another operator must decide"
        )
    if approver == _identity(auditor):
        raise HumanDecisionError(
            f"separation of duties: {decision.user!r} signed the audit and cannot also "
            "approve; another operator must decide"
        )


def _human_gate_decision(gate: str, decision: HumanDecision, passed: bool) -> GateDecision:
    return GateDecision(
        gate=gate,
        passed=passed,
        reasons=[f"{decision.user} decided {decision.decision}: {decision.comment}"],
        evidence={
            "user": decision.user,
            "roles": sorted(decision.roles),
            "decision": decision.decision,
            "comment": decision.comment,
        },
        verdict=Verdict.PASS if passed else Verdict.FAIL,
    )


def decide_audit(decision: HumanDecision, *, submitter: str, awaiting: str) -> GateDecision:
    """Validate an audit decision and turn it into the audit gate's result."""
    validate_audit_decision(decision, submitter=submitter, awaiting=awaiting)
    return _human_gate_decision(AUDIT, decision, decision.decision == AuditDecisionKind.SIGN)


def decide_approval(
    decision: HumanDecision, *, submitter: str, auditor: str | None, awaiting: str
) -> GateDecision:
    """Validate an approval decision and turn it into the approval gate's result."""
    validate_approval_decision(decision, submitter=submitter, auditor=auditor, awaiting=awaiting)
    return _human_gate_decision(
        APPROVAL, decision, decision.decision == ApprovalDecisionKind.APPROVE
    )


def decide_alarm_override(
    decision: HumanDecision, *, submitter: str, awaiting: str
) -> GateDecision:
    """Validate an operator's override of the stability alarms; it passes the gate.

    The submitter may not override the alarms their own run raised, and the written
    reason is required: it is what an auditor reads later.
    """
    operator = _check_common(decision, gate=STABILITY, awaiting=awaiting, role=OPERATOR_ROLE,
                             allowed=AlarmOverrideKind)
    if operator == _identity(submitter):
        raise HumanDecisionError(
            f"separation of duties: {decision.user!r} submitted the training run and "
            "cannot override its stability alarms; another operator must decide"
        )
    return _human_gate_decision(STABILITY, decision, True)
