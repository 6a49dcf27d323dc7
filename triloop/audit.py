"""Append to and verify the hash-chained audit log.

Each row stores ``hash = sha256(prev_hash || canonical row)`` where the canonical
row is compact, key-sorted JSON of every column but the hashes. Writers take a
transaction-scoped advisory lock, read the head and append ``seq = head + 1``;
a trigger refuses any insert that does not extend the head, so concurrent
writers serialise into one chain instead of forking it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, text
from sqlmodel import Session, col, select

from triloop.models.audit import AuditEvent

GENESIS_HASH = "0" * 64
_LOCK_SQL = text("SELECT pg_advisory_xact_lock(hashtext('triloop.audit_event'))")
_HEAD_SQL = text("SELECT seq, hash FROM audit_event ORDER BY seq DESC LIMIT 1")


def canonical_row(
    *,
    seq: int,
    at: datetime,
    actor: Mapping[str, Any],
    action: str,
    resource: Mapping[str, Any],
    decision: str,
    decision_id: str | None,
    policy_revision: str | None,
    payload: Mapping[str, Any],
) -> bytes:
    """The bytes that are hashed for one row."""
    document = {
        "seq": seq,
        "at": at.astimezone(UTC).isoformat(timespec="microseconds"),
        "actor": actor,
        "action": action,
        "resource": resource,
        "decision": decision,
        "decision_id": decision_id,
        "policy_revision": policy_revision,
        "payload": payload,
    }
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def canonical_row_of(event: AuditEvent) -> bytes:
    """The hashed bytes of a stored (or about to be stored) event."""
    return canonical_row(
        seq=event.seq,
        at=event.at,
        actor=event.actor,
        action=event.action,
        resource=event.resource,
        decision=event.decision,
        decision_id=event.decision_id,
        policy_revision=event.policy_revision,
        payload=event.payload,
    )


def chain_hash(prev_hash: str, row: bytes) -> str:
    """``sha256(prev_hash || row)`` as hex."""
    return hashlib.sha256(prev_hash.encode() + row).hexdigest()


def append_event(
    session: Session,
    *,
    actor: Mapping[str, Any],
    action: str,
    resource: Mapping[str, Any],
    decision: str,
    decision_id: str | None = None,
    policy_revision: str | None = None,
    payload: Mapping[str, Any] | None = None,
) -> AuditEvent:
    """Append one event in the session's transaction (the caller commits)."""
    session.execute(_LOCK_SQL)
    head = session.execute(_HEAD_SQL).first()
    seq = 1 if head is None else int(head[0]) + 1
    prev_hash = GENESIS_HASH if head is None else str(head[1])
    # Round-trip through JSON so what we hash is exactly what JSONB will give back.
    actor_doc = json.loads(json.dumps(dict(actor), allow_nan=False))
    resource_doc = json.loads(json.dumps(dict(resource), allow_nan=False, default=str))
    payload_doc = json.loads(json.dumps(dict(payload or {}), allow_nan=False, default=str))
    event = AuditEvent(
        seq=seq,
        at=datetime.now(UTC),
        actor=actor_doc,
        action=action,
        resource=resource_doc,
        decision=decision,
        decision_id=decision_id,
        policy_revision=policy_revision,
        payload=payload_doc,
        prev_hash=prev_hash,
        hash="",
    )
    event.hash = chain_hash(prev_hash, canonical_row_of(event))
    session.add(event)
    session.flush()
    return event


@dataclass(frozen=True)
class ChainReport:
    """Result of walking the chain: ok, rows checked, and the first broken row."""

    ok: bool
    checked: int
    broken_seq: int | None = None
    problem: str | None = None


def _rows(engine: Engine, batch: int = 2000) -> Iterator[AuditEvent]:
    last = 0
    while True:
        with Session(engine) as session:
            rows = list(
                session.exec(
                    select(AuditEvent)
                    .where(col(AuditEvent.seq) > last)
                    .order_by(col(AuditEvent.seq))
                    .limit(batch)
                )
            )
        if not rows:
            return
        yield from rows
        last = int(rows[-1].seq)


def verify_chain(engine: Engine) -> ChainReport:
    """Recompute every hash; report the first row that is edited, missing or out of order."""
    prev_hash = GENESIS_HASH
    expected_seq = 1
    checked = 0
    for event in _rows(engine):
        if event.seq != expected_seq:
            return ChainReport(
                False, checked, expected_seq, f"row {expected_seq} is missing (next is {event.seq})"
            )
        if event.prev_hash != prev_hash:
            return ChainReport(False, checked, event.seq, "prev_hash does not match the row before")
        row = canonical_row_of(event)
        if chain_hash(prev_hash, row) != event.hash:
            return ChainReport(False, checked, event.seq, "contents do not match the stored hash")
        prev_hash = event.hash
        expected_seq += 1
        checked += 1
    return ChainReport(True, checked)


class DatabaseAuditSink:
    """Records every policy decision as an audit event, in its own transaction.

    Used as the ``AuditSink`` of ``triloop.policy.Authorizer``; the engine is the
    calling service's own role, so the row also shows which role wrote it.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __call__(
        self,
        actor: Any,
        action: str,
        resource: Any,
        decision: Any,
        context: Mapping[str, Any] | None,
    ) -> None:
        """Append the decision (allow or deny) with OPA's decision id and revision."""
        from triloop.db import session_scope

        with session_scope(self._engine) as session:
            append_event(
                session,
                actor=actor.to_input(),
                action=action,
                resource=resource.to_input(),
                decision="allow" if decision.allow else "deny",
                decision_id=decision.decision_id,
                policy_revision=decision.policy_revision,
                payload={"reasons": list(decision.reasons), "context": dict(context or {})},
            )


def record_event(
    engine: Engine,
    *,
    actor: Mapping[str, Any],
    action: str,
    resource: Mapping[str, Any],
    payload: Mapping[str, Any] | None = None,
) -> AuditEvent:
    """Append a non-decision event (an alarm, a gate verdict) in its own transaction."""
    from triloop.db import session_scope

    with session_scope(engine) as session:
        return append_event(
            session, actor=actor, action=action, resource=resource, decision="record",
            payload=payload,
        )
