"""Audit, approval and alarm override: the rules a person's decision must meet, and the
gate result it makes.

Pure functions over the kernel's ``HumanDecision``: the row only the web role writes, with
the person's roles read from the database just now. On one path each rule runs once:
the promotion's update validator asks only whether it is the decision's turn
(``refuse_out_of_turn``); the activity that carries the decision out runs ``decide_human``
once, after loading the decision. These rules re-check what OPA already checked before the
web service sent the update: a bug or a bypass of one layer must still meet the other.
Identities are compared after trimming and case-folding, so "Alice" cannot approve what
"alice" submitted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from governance_loop.gates.decision import GateDecision, Verdict
from triloop.statuses import Gate, PromotionDecision, deciding_role

if TYPE_CHECKING:  # the decision as the kernel loads it; this module stays pure
    from triloop.decisions import HumanDecision

AUDITOR_ROLE = "auditor"
OPERATOR_ROLE = "operator"


class HumanDecisionError(ValueError):
    """A human decision that the workflow must refuse; the message says why."""


def refuse_out_of_turn(gate: Gate, awaiting: str | None) -> None:
    """Refuse a decision for ``gate`` while the promotion waits at another gate."""
    if awaiting != gate:
        waiting_at = "" if awaiting is None else str(awaiting)
        raise HumanDecisionError(
            f"this promotion is at gate {waiting_at!r}, not {gate.value!r}: the {gate} "
            "decision cannot be taken now"
        )


def _identity(name: str) -> str:
    return name.strip().casefold()


def _check_common(decision: HumanDecision, *, gate: Gate) -> PromotionDecision:
    """Checks every human gate shares; returns what the person decided."""
    if not decision.user.strip():
        raise HumanDecisionError(f"a {gate} decision needs the signed-in user who takes it")
    role = deciding_role(gate)
    if role not in decision.roles:
        raise HumanDecisionError(
            f"user {decision.user!r} lacks the {role!r} role needed for the {gate} decision "
            f"(has {sorted(decision.roles)})"
        )
    choice = decision.choice
    if choice is None or choice.gate is not gate:
        choices = [d.verb.value for d in PromotionDecision.at(gate)]
        raise HumanDecisionError(
            f"unknown {gate} decision {decision.decision!r}; expected one of {choices}"
        )
    if not decision.comment.strip():
        raise HumanDecisionError(f"a {gate} decision needs a comment saying why")
    return choice


def _refuse_duty_conflicts(decision: HumanDecision, *, gate: Gate, submitter: str,
                           auditor: str | None) -> None:
    """Separation of duties: the submitter decides nothing; the auditor does not approve."""
    person = _identity(decision.user)
    if gate is Gate.APPROVAL and (auditor is None or not auditor.strip()):
        raise HumanDecisionError("no signed audit: an auditor must sign before approval")
    if person == _identity(submitter):
        doing = {Gate.AUDIT: "audit its candidate", Gate.APPROVAL: "approve its candidate",
                 Gate.STABILITY: "override its stability alarms"}[gate]
        other = "auditor must sign" if gate is Gate.AUDIT else "operator must decide"
        raise HumanDecisionError(
            f"separation of duties: {decision.user!r} submitted the training run and "
            f"cannot {doing}; another {other}"
        )
    if gate is Gate.APPROVAL and auditor is not None and person == _identity(auditor):
        raise HumanDecisionError(
            f"separation of duties: {decision.user!r} signed the audit and cannot also "
            "approve; another operator must decide"
        )


def decide_human(
    decision: HumanDecision, *, gate: Gate, submitter: str, auditor: str | None = None
) -> GateDecision:
    """Refuse a decision that breaks the rules, else turn it into ``gate``'s result.

    ``auditor`` is who signed the audit (approval decisions need one). An alarm override
    always passes its gate: the written reason is required, since an auditor reads it later.
    """
    choice = _check_common(decision, gate=gate)
    _refuse_duty_conflicts(decision, gate=gate, submitter=submitter, auditor=auditor)
    return GateDecision(
        gate=gate,
        passed=choice.passes,
        reasons=[f"{decision.user} decided {decision.decision}: {decision.comment}"],
        evidence={
            "user": decision.user,
            "roles": sorted(decision.roles),
            "decision": decision.decision,
            "comment": decision.comment,
        },
        verdict=Verdict.PASS if choice.passes else Verdict.FAIL,
    )
