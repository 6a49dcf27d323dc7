"""May production move to this candidate now: what promote re-checks under the alias lock.

Pure rules over the promotion row, its gate results and the alias's history, read in the
transaction that moves the alias. They hold whoever drives the workflow: a reset (a new
run that replays the history up to a chosen point and runs on from there), a restart, a
terminate or a cancel cannot reach production without the gates.

Refusals, handled in this order, each naming its rule (``PromoteRefused.rule``):

1. ``promotion_run``: the promotion belongs to another workflow, or to another run of this
   workflow. A reset keeps the workflow id and makes a new run id; only the run that opened
   the promotion may change it. (``refuse_foreign_run`` is the same rule for every other
   state change of a promotion.)
2. ``promotion_ended``: the promotion row is not open (it was rejected, rolled back, ...).
3. ``gates``: a gate before promote has no passing ``gate_result`` for this promotion, or
   has a failing one.
4. ``rolled_back``: the candidate was rolled back on production after the first of those
   gate results: its evidence predates the rollback.

Each way out is the same: propose the candidate again, so a new promotion judges it anew.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from triloop.deployment_history import ROLLBACK_KIND, Revision
from triloop.statuses import Gate, PromotionStatus

# The gates a candidate passes before promote, in order (``GATE_ORDER`` up to promote).
GATES_BEFORE_PROMOTE: tuple[Gate, ...] = (
    Gate.STABILITY, Gate.OFFLINE_EVAL, Gate.SHADOW, Gate.CANARY, Gate.AUDIT, Gate.APPROVAL,
)
AGAIN = "propose the candidate again, so a new promotion runs every gate for it"


class PromoteRefused(ValueError):
    """Production may not move (or the promotion not change); the message says why."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule


@dataclass(frozen=True)
class RunRef:
    """A workflow run: the one a promotion row names, or the one calling an activity."""

    workflow_id: str | None
    run_id: str | None


@dataclass(frozen=True)
class StoredGate:
    """One ``gate_result`` row of the promotion, as promote reads it."""

    gate: str
    passed: bool
    created_at: datetime


@dataclass(frozen=True)
class PromoteFacts:
    """What promote reads under the alias's row lock."""

    promotion_id: str
    status: str
    owner: RunRef  # the run the promotion row records
    caller: RunRef | None  # the run calling promote; None outside a workflow (CLI, tests)
    candidate_checkpoint_id: str
    gates: Sequence[StoredGate]
    history: Sequence[Revision]  # the production alias's revisions, oldest first


def same_run(*, owner: RunRef, caller: RunRef) -> bool:
    """Whether ``caller`` is the run that opened the promotion (what it records of it)."""
    return ((owner.workflow_id is None or caller.workflow_id == owner.workflow_id)
            and (owner.run_id is None or caller.run_id == owner.run_id))


def refuse_foreign_run(promotion_id: str, *, owner: RunRef, caller: RunRef | None) -> None:
    """``promotion_run``: refuse a change to a promotion from a run that did not open it.

    A row opened before runs were recorded (``owner.run_id`` None) names only its workflow.
    """
    if caller is None or same_run(owner=owner, caller=caller):
        return
    if owner.workflow_id is not None and caller.workflow_id != owner.workflow_id:
        raise PromoteRefused("promotion_run", (
            f"promotion {promotion_id} belongs to workflow {owner.workflow_id}, not "
            f"{caller.workflow_id}; {AGAIN}"))
    if owner.run_id is not None and caller.run_id != owner.run_id:
        raise PromoteRefused("promotion_run", (
            f"promotion {promotion_id} belongs to run {owner.run_id} of workflow "
            f"{owner.workflow_id}, and this is run {caller.run_id} (a reset or a restart "
            f"replays a promotion; only the run that opened it may change it); {AGAIN}"))


def _refuse_ended(facts: PromoteFacts) -> None:
    if facts.status != PromotionStatus.open:
        raise PromoteRefused("promotion_ended", (
            f"promotion {facts.promotion_id} ended {facts.status}; an ended promotion never "
            f"moves production; {AGAIN}"))


def _gates_started(facts: PromoteFacts) -> datetime:
    """When the evidence promote relies on began: the first of the earlier gates' passes."""
    missing, failed = [], []
    for gate in GATES_BEFORE_PROMOTE:
        rows = [g for g in facts.gates if g.gate == gate]
        if any(not g.passed for g in rows):
            failed.append(gate.value)
        elif not rows:
            missing.append(gate.value)
    if failed or missing:
        parts = ([f"failed at {', '.join(failed)}"] if failed else []) + (
            [f"no passing result for {', '.join(missing)}"] if missing else [])
        raise PromoteRefused("gates", (
            f"promotion {facts.promotion_id} has not passed every gate before promote "
            f"({'; '.join(parts)}); {AGAIN}"))
    return min(g.created_at for g in facts.gates if g.gate in GATES_BEFORE_PROMOTE)


def _refuse_rolled_back(facts: PromoteFacts, since: datetime) -> None:
    rollbacks = [r for r in facts.history if r.kind == ROLLBACK_KIND
                 and r.previous_checkpoint_id == facts.candidate_checkpoint_id
                 and r.created_at >= since]
    if rollbacks:
        last = rollbacks[-1]
        raise PromoteRefused("rolled_back", (
            f"checkpoint {facts.candidate_checkpoint_id} was rolled back at revision "
            f"{last.number} of production, after promotion {facts.promotion_id}'s gates "
            f"judged it; a rolled-back candidate returns only through a new promotion; "
            f"{AGAIN}"))


def refuse_promote(facts: PromoteFacts) -> None:
    """Raise ``PromoteRefused`` for the first rule (in the module's order) that refuses."""
    refuse_foreign_run(facts.promotion_id, owner=facts.owner, caller=facts.caller)
    _refuse_ended(facts)
    since = _gates_started(facts)
    _refuse_rolled_back(facts, since)
