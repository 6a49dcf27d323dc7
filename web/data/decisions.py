"""Human decisions: the row the database writes for the person whose secret it checked.

The web role may not insert ``human_decision``. It calls ``triloop_record_decision`` with
the raw secret the person presented with this request (their API token or console session
secret); the database hashes it, matches it against that person's live rows and stamps the
person from the match, never from an argument (migration 0020). So the web service can
relay a person's decision but not invent one. A loop acts on it only by reading the row
back (``triloop.decisions``), so the Temporal update or signal that follows carries nothing
but its id.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import text
from sqlmodel import Session

from triloop.models import HumanDecisionRow
from triloop.statuses import Decision, DecisionKind

_RECORD_SQL = text(
    "SELECT triloop_record_decision(:credential, :kind, :subject, :decision, :comment,"
    " CAST(:details AS jsonb))")


class DecisionNotRecorded(Exception):
    """The database stamped another person than the one this request was authorized for."""


def record_decision(
    *, session: Session, kind: DecisionKind, subject: str, decision: Decision, user: str,
    credential: str | None, comment: str = "", details: Mapping[str, Any] | None = None,
) -> str:
    """Have the database record ``user``'s decision from their secret; returns its id."""
    decision_id = str(session.execute(_RECORD_SQL, {
        "credential": credential, "kind": str(kind), "subject": subject,
        "decision": str(decision), "comment": comment,
        "details": json.dumps(dict(details or {}), default=str)}).scalar_one())
    row = session.get(HumanDecisionRow, decision_id)
    if row is None or row.user_name != user:
        raise DecisionNotRecorded(
            f"decision {decision_id} was stamped for {row.user_name if row else None!r},"
            f" not for {user!r}, who this request was authorized for")
    return decision_id
