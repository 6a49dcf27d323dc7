"""Human decisions: the row the web role writes once it has authenticated the person.

A loop acts on a person's decision only by reading this row back (``triloop.decisions``),
so the Temporal update or signal that follows carries nothing but its id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlmodel import Session

from triloop.models import HumanDecisionRow
from triloop.statuses import Decision, DecisionKind


def record_decision(
    *, session: Session, kind: DecisionKind, subject: str, decision: Decision, user: str,
    comment: str = "", details: Mapping[str, Any] | None = None,
) -> str:
    """Insert the decision (the database stamps ``recorded_by``); returns its id."""
    row = HumanDecisionRow(kind=kind, subject=subject, decision=decision, user_name=user,
                           comment=comment, details=dict(details or {}))
    session.add(row)
    session.flush()
    return row.id
