"""Append to and verify the hash-chained audit log.

Each row stores ``hash = sha256(prev_hash || canonical row)``. No role may INSERT into
``audit_event``: a writer makes one call, ``triloop_audit_log(...)`` (SECURITY DEFINER,
migration 0020), which takes the chain head under a bounded wait, stamps the role that
logged in, computes the hash itself and appends, so no caller chooses a hash or holds the
head between calls. Its canonical row is jsonb's own text of the stored values
(``triloop_audit_canonical``); rows from before 0020 (``hashed_in_db`` false) hash the
compact, key-sorted JSON their writer made (``canonical_row``). ``verify_chain`` recomputes
both. The database also refuses a service role naming another service or any person as the
actor; the web role names a person only with the raw secret that person presented with
this request (``credential``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, func, text
from sqlmodel import Session, col, select

from triloop.metrics import AUDIT_APPENDS
from triloop.models.audit import AuditEvent

GENESIS_HASH = "0" * 64
_LOG_SQL = text(
    "SELECT seq, at, prev_hash, hash, db_role FROM triloop_audit_log(CAST(:actor AS jsonb),"
    " :action, CAST(:resource AS jsonb), :decision, :decision_id, :policy_revision,"
    " CAST(:payload AS jsonb), :credential)")
# The database role each service's actor is written by (audit verify checks the pairing).
SERVICE_ROLES = {"execution": "triloop_execution", "learning": "triloop_learning",
                 "governance": "triloop_governance", "web": "triloop_web",
                 "verifier": "triloop_verifier"}


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
    db_role: str | None = None,
) -> bytes:
    """The bytes that are hashed for one row (rows from before ``db_role`` hash without it)."""
    document: dict[str, Any] = {
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
    if db_role is not None:
        document["db_role"] = db_role
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
        db_role=event.db_role,
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
    credential: str | None = None,
) -> AuditEvent:
    """Append one event in the session's transaction (the caller commits).

    ``credential``: the raw secret the person named in ``actor`` presented with this
    request; the database refuses a person without it (and any person from a loop).
    """
    actor_doc = _json(actor)
    resource_doc, payload_doc = _json(resource), _json(payload or {})
    row = session.execute(_LOG_SQL, {
        "actor": json.dumps(actor_doc), "action": action, "resource": json.dumps(resource_doc),
        "decision": decision, "decision_id": decision_id, "policy_revision": policy_revision,
        "payload": json.dumps(payload_doc), "credential": credential,
    }).one()
    AUDIT_APPENDS.labels(log="chain", decision=decision).inc()
    return AuditEvent(seq=int(row[0]), at=row[1], actor=actor_doc, action=action,
                      resource=resource_doc, decision=decision, decision_id=decision_id,
                      policy_revision=policy_revision, payload=payload_doc, prev_hash=str(row[2]),
                      hash=str(row[3]), db_role=str(row[4]), hashed_in_db=True)


def _json(document: Mapping[str, Any]) -> dict[str, Any]:
    # What JSONB will store; NaN is refused, anything else unknown is written as text.
    loaded: dict[str, Any] = json.loads(json.dumps(dict(document), allow_nan=False, default=str))
    return loaded


@dataclass(frozen=True)
class ChainReport:
    """Result of walking the chain: ok, rows checked, and the first broken row."""

    ok: bool
    checked: int
    broken_seq: int | None = None
    problem: str | None = None


_CANONICAL_IN_DB = func.triloop_audit_canonical(
    col(AuditEvent.seq), col(AuditEvent.at), col(AuditEvent.actor), col(AuditEvent.action),
    col(AuditEvent.resource), col(AuditEvent.decision), col(AuditEvent.decision_id),
    col(AuditEvent.policy_revision), col(AuditEvent.payload), col(AuditEvent.db_role))


def _rows(engine: Engine, batch: int = 2000) -> Iterator[tuple[AuditEvent, bytes]]:
    """Each row with the bytes its hash covers (PostgreSQL's canonical text since 0020)."""
    last = 0
    while True:
        with Session(engine) as session:
            rows = list(
                session.exec(
                    select(AuditEvent, _CANONICAL_IN_DB)
                    .where(col(AuditEvent.seq) > last)
                    .order_by(col(AuditEvent.seq))
                    .limit(batch)
                )
            )
        if not rows:
            return
        for event, in_db in rows:
            yield event, (str(in_db).encode() if event.hashed_in_db else canonical_row_of(event))
        last = int(rows[-1][0].seq)


def verify_chain(engine: Engine) -> ChainReport:
    """Recompute every hash; report the first row that is edited, missing or out of order."""
    prev_hash = GENESIS_HASH
    expected_seq = 1
    checked = 0
    for event, row in _rows(engine):
        if event.seq != expected_seq:
            return ChainReport(
                False, checked, expected_seq, f"row {expected_seq} is missing (next is {event.seq})"
            )
        if event.prev_hash != prev_hash:
            return ChainReport(False, checked, event.seq, "prev_hash does not match the row before")
        if chain_hash(prev_hash, row) != event.hash:
            return ChainReport(False, checked, event.seq, "contents do not match the stored hash")
        mismatch = actor_role_mismatch(event)
        if mismatch is not None:
            return ChainReport(False, checked, event.seq, mismatch)
        prev_hash = event.hash
        expected_seq += 1
        checked += 1
    return ChainReport(True, checked)


def chain_head(engine: Engine) -> tuple[int, str] | None:
    """(seq, hash) of the newest row, or None for an empty chain."""
    with Session(engine) as session:
        row = session.exec(select(AuditEvent).order_by(col(AuditEvent.seq).desc()).limit(1)
                           ).first()
    return None if row is None else (int(row.seq), row.hash)


def stored_hashes(engine: Engine, seqs: list[int]) -> dict[int, str]:
    """The stored hash of each of these rows that exists."""
    with Session(engine) as session:
        rows = session.exec(select(AuditEvent).where(col(AuditEvent.seq).in_(seqs)))
        return {int(r.seq): r.hash for r in rows}


def actor_role_mismatch(event: AuditEvent) -> str | None:
    """Why a row's actor could not have been written by its database role, if it could not.

    A service's events come from that service's role; the migration owner may write any
    (set-up, tests). Rows from before roles were recorded (``db_role`` NULL) are not judged.
    """
    if event.db_role is None or event.db_role not in SERVICE_ROLES.values():
        return None
    service = str((event.actor or {}).get("service", "")).strip().lower()
    expected = SERVICE_ROLES.get(service)
    if expected != event.db_role:
        return (f"actor {service or '(none)'!r} was written by database role {event.db_role!r},"
                f" which only {next(s for s, r in SERVICE_ROLES.items() if r == event.db_role)!r}"
                " logs in as")
    return None


# Allowed reads go to the access log (``access_event``), not the chain of decisions: a page
# view is not a decision an auditor reviews. A denied read is, and stays in the chain.
READ_ACTIONS = frozenset({"read"})


# No role may INSERT into ``access_event``: ``triloop_access_append`` (SECURITY DEFINER,
# migration 0022) appends and stamps ``db_role`` with the role that logged in.
_ACCESS_SQL = text(
    "SELECT triloop_access_append(CAST(:actor AS jsonb), :action, CAST(:resource AS jsonb),"
    " :decision_id, :policy_revision)")


def append_access(
    session: Session, *, actor: Mapping[str, Any], action: str, resource: Mapping[str, Any],
    decision_id: str | None, policy_revision: str | None,
) -> None:
    """Append one allowed read to the append-only access log (the database stamps the role)."""
    session.execute(_ACCESS_SQL, {
        "actor": json.dumps(dict(actor), allow_nan=False, default=str), "action": action,
        "resource": json.dumps(dict(resource), allow_nan=False, default=str),
        "decision_id": decision_id, "policy_revision": policy_revision})
    AUDIT_APPENDS.labels(log="access", decision="allow").inc()


class DatabaseAuditSink:
    """Records every policy decision, in its own transaction: allowed reads in the access
    log, everything else as an audit event in the chain.

    Used as the ``AuditSink`` of ``triloop.policy.Authorizer``; the engine is the
    calling service's own role, so the row also shows which role wrote it.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._revision: str | None = None  # the last policy revision this process saw

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

        revision = decision.policy_revision
        with session_scope(self._engine) as session:
            if revision is not None and revision != self._revision:
                # A new policy decides from here on: say so once, old and new revision.
                append_event(session, actor=actor.to_input(), action="policy_revision_changed",
                             resource={"kind": "policy", "id": revision}, decision="record",
                             policy_revision=revision, credential=actor.credential,
                             payload={"old": self._revision, "new": revision})
            # A read asked about with context (e.g. a refused NUL input) stays a decision.
            if decision.allow and action in READ_ACTIONS and not context:
                append_access(session, actor=actor.to_input(), action=action,
                              resource=resource.to_input(), decision_id=decision.decision_id,
                              policy_revision=decision.policy_revision)
            else:
                append_event(
                    session,
                    actor=actor.to_input(),
                    action=action,
                    resource=resource.to_input(),
                    decision="allow" if decision.allow else "deny",
                    decision_id=decision.decision_id,
                    policy_revision=decision.policy_revision,
                    payload={"reasons": list(decision.reasons), "context": dict(context or {})},
                    credential=actor.credential,
                )
        if revision is not None:
            self._revision = revision


def record_event(
    engine: Engine,
    *,
    actor: Mapping[str, Any],
    action: str,
    resource: Mapping[str, Any],
    payload: Mapping[str, Any] | None = None,
    decision_id: str | None = None,
    decision: str = "record",
    credential: str | None = None,
) -> AuditEvent:
    """Append an event in its own transaction: a non-decision ``record`` (an alarm, a gate
    verdict, the outcome of an allowed action: ``decision_id`` then names the authorization
    it follows), or the ``deny`` of an allowed action that was then refused."""
    from triloop.db import session_scope

    with session_scope(engine) as session:
        return append_event(
            session, actor=actor, action=action, resource=resource, decision=decision,
            payload=payload, decision_id=decision_id, credential=credential,
        )
