"""The stability gate's reads: a run's recorded alarms and the copies its proposal carries.

A run's alarms are recorded twice by the learning loop, in one transaction per iteration:
``training_step.alarms`` and a ``stability_alarm`` event in the hash-chained audit log,
which no role can change. Governance takes the union of both as the run's alarms, so an
alarm erased from ``training_step`` afterwards still counts, and the proposal's copies
(its row's evidence, the promotion workflow's input) must match it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import text
from sqlmodel import Session

from governance_loop.gates import RecordedAlarm, StabilityCheck, ThresholdSpec, decide_stability
from triloop.models import Proposal
from triloop.workflow_api import StabilityAlarm


def recorded_alarms(*, session: Session, run_id: str) -> set[RecordedAlarm]:
    """Every alarm the run recorded, in ``training_step`` or in the audit log."""
    stored = session.execute(text(
        "SELECT iteration, unnest(alarms) FROM training_step WHERE run_id = :r"),
        {"r": run_id}).all()
    audited = session.execute(text(
        "SELECT (payload->>'iteration')::int, payload->>'kind' FROM audit_event "
        "WHERE action = 'stability_alarm' AND actor->>'service' = 'learning' "
        "AND resource->>'kind' = 'training_run' AND resource->>'id' = :r"),
        {"r": run_id}).all()
    return {RecordedAlarm(int(i), str(k)) for i, k in [*stored, *audited] if k is not None}


def _from_evidence(evidence: Mapping[str, Any]) -> list[RecordedAlarm]:
    listed = evidence.get("stability_alarms") or []
    return [RecordedAlarm(int(a["iteration"]), str(a["kind"])) for a in listed]


def proposed_iteration(*, session: Session, proposal: Proposal) -> int:
    """The iteration the proposal names (its evidence), else its checkpoint's."""
    named = proposal.evidence.get("iteration")
    if isinstance(named, int):
        return named
    found = session.execute(text("SELECT iteration FROM checkpoint WHERE id = :c"),
                            {"c": proposal.checkpoint_id}).scalar_one_or_none()
    return int(found or 0)


def check_proposal(
    *, session: Session, proposal: Proposal, carried: Iterable[StabilityAlarm],
    spec: ThresholdSpec,
) -> StabilityCheck:
    """The stability gate for a proposal, from the database and the workflow's input."""
    return decide_stability(
        recorded=recorded_alarms(session=session, run_id=proposal.run_id),
        proposal_evidence=_from_evidence(proposal.evidence),
        proposal_input=[RecordedAlarm(a.iteration, a.kind) for a in carried],
        proposed_iteration=proposed_iteration(session=session, proposal=proposal),
        thresholds=spec,
    )
