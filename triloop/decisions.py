"""Load a person's decision the way a loop may trust it: from the row only the web role wrote.

A Temporal update or signal names a ``human_decision`` row by id and nothing else. The
loop that carries the decision out calls ``load_decision``, which refuses:
- an id with no row (a forged or mistyped reference);
- a row some other role inserted (``recorded_by`` is stated by the database);
- a row about another subject or of another kind (a decision replayed elsewhere);
- a person who no longer exists or is disabled;
- a person who does not hold, now, the role the decision needs;
- a decision another execution already carried out (``decision_use``, migration 0020: one
  row per decision, written in the proving transaction, naming the workflow run and
  activity that used it; a retry of that same activity execution passes, a second
  workflow, a reset's new run or another activity is refused).
The person and their roles come from ``app_user`` at that moment, never from a payload, and
so does ``role_since``: when that role became active (the second admin's confirmation of
its ``role_grant``; for founding admins and people from before two-person grants, the
person's ``created_at``), which the caller compares with what the decision is about.
Each refusal is written to the audit log by ``audit_refusal`` in a transaction of its own,
so it stays on record although the action does not happen.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, text
from sqlmodel import Session, col, select
from temporalio import activity

from triloop.audit import append_event
from triloop.db import session_scope
from triloop.models.decisions import WEB_ROLE, HumanDecisionRow
from triloop.models.users import RoleGrant, User
from triloop.policy import Actor
from triloop.statuses import DecisionKind, GrantStatus, PromotionDecision


class DecisionRefused(Exception):
    """A decision reference a loop must not act on; the message says why."""


@dataclass(frozen=True)
class HumanDecision:
    """A person's decision as a loop may trust it: the row only the web role writes, with the
    person's roles read from the database just now (by ``load_decision``).

    The web service records it (``HumanDecisionRow``) and sends only its id; the activity
    that carries it out gets this back and hands it, unchanged, to the pure rules.
    """

    id: str
    kind: DecisionKind
    subject: str
    decision: str
    comment: str
    details: Mapping[str, Any]
    user: str
    roles: tuple[str, ...]
    role_since: datetime | None = None
    """When the role the decision needed became active (None when no role was asked)."""

    @property
    def choice(self) -> PromotionDecision | None:
        """The promotion decision this is (None when it is about something else)."""
        return PromotionDecision.recorded(self.kind, self.decision)

    @property
    def person(self) -> Actor:
        """The person as the policy sees them: signed in through the web service."""
        return Actor(service="web", user=self.user, roles=self.roles)


def load_decision(
    session: Session, *, decision_id: str, kind: DecisionKind, subject: str,
    role: str | None = None, execution: str | None = None,
) -> HumanDecision:
    """The recorded decision, or ``DecisionRefused`` naming what does not hold.

    With ``execution`` (``current_execution()``) the decision is also marked used by it, in
    the session's transaction: the caller commits before it acts.
    """
    row = session.get(HumanDecisionRow, decision_id) if decision_id else None
    if row is None:
        raise DecisionRefused(f"no human decision {decision_id!r} is recorded")
    if row.recorded_by != WEB_ROLE:
        raise DecisionRefused(
            f"decision {decision_id} was recorded by database role {row.recorded_by!r}, not by"
            f" the web service ({WEB_ROLE}), which alone authenticates people")
    if row.kind != kind or row.subject != subject:
        raise DecisionRefused(
            f"decision {decision_id} is of kind {row.kind!r} about {row.subject!r}; this needs"
            f" kind {kind.value!r} about {subject!r}")
    user = session.get(User, row.user_name)
    if user is None or user.disabled:
        state = "does not exist" if user is None else "is disabled"
        raise DecisionRefused(f"decision {decision_id}: user {row.user_name!r} {state}")
    if role is not None and role not in user.roles:
        raise DecisionRefused(
            f"decision {decision_id}: user {user.name!r} does not hold the {role!r} role"
            f" (holds {sorted(user.roles)})")
    if execution is not None:
        use_decision(session, decision_id=row.id, execution=execution)
    return HumanDecision(
        id=row.id, kind=DecisionKind(row.kind), subject=row.subject, decision=row.decision,
        comment=row.comment, details=dict(row.details), user=user.name,
        roles=tuple(user.roles),
        role_since=None if role is None else role_active_since(session, user=user, role=role))


_USE_SQL = text("INSERT INTO decision_use (decision_id, execution) VALUES (:d, :e)"
                " ON CONFLICT (decision_id) DO NOTHING")
_USED_SQL = text("SELECT execution, used_by, used_at FROM decision_use WHERE decision_id = :d")


def use_decision(session: Session, *, decision_id: str, execution: str) -> None:
    """Mark the decision used by ``execution``; refuse it if another execution used it."""
    session.execute(_USE_SQL, {"d": decision_id, "e": execution})
    used = session.execute(_USED_SQL, {"d": decision_id}).one()
    if used[0] != execution:
        raise DecisionRefused(
            f"decision {decision_id} was already carried out by {used[0]} ({used[1]}, at"
            f" {used[2].isoformat(timespec='seconds')}); a decision is used once: the person"
            " records a new one")


def current_execution() -> str:
    """This activity execution (its retries share it): workflow, run and activity id.

    Outside an activity (a CLI, a test calling the method) every call is its own execution.
    """
    try:
        info = activity.info()
    except RuntimeError:
        return f"outside-an-activity/{uuid.uuid4().hex}"
    return f"{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}"


def role_active_since(session: Session, *, user: User, role: str) -> datetime:
    """When ``user`` came to hold ``role``: the latest confirmed grant, else their creation."""
    confirmed = session.exec(
        select(RoleGrant.confirmed_at).where(
            RoleGrant.user_name == user.name, RoleGrant.role == role,
            RoleGrant.status == GrantStatus.active).order_by(col(RoleGrant.confirmed_at).desc())
    ).first()
    return confirmed if confirmed is not None else user.created_at


def audit_refusal(engine: Engine, *, service: str, action: str, resource: Mapping[str, Any],
                  decision_id: str, reason: str) -> None:
    """Record that a loop refused a decision reference (committed on its own)."""
    with session_scope(engine) as session:
        append_event(session, actor=Actor(service=service).to_input(), action=action,
                     resource=resource, decision="deny",
                     payload={"human_decision_id": decision_id, "reasons": [reason]})
