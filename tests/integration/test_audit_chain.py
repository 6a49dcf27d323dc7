"""The audit log is append-only for every role and hash-chained without forks."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from triloop.audit import append_event, verify_chain
from triloop.db import session_scope

pytestmark = pytest.mark.integration


def _append(engine: Engine, action: str = "test.write", *, actor: str = "execution",
            **payload: object) -> int:
    with session_scope(engine) as session:
        event = append_event(
            session,
            actor={"service": actor},
            action=action,
            resource={"kind": "trajectory", "id": "x"},
            decision="allow",
            decision_id="d-1",
            policy_revision="rev",
            payload=dict(payload),
        )
        return event.seq


@pytest.mark.parametrize("service", ["execution", "learning", "governance", "web"])
def test_every_role_can_append_but_never_edit(
    role_engine: Callable[[str], Engine], service: str, owner_engine: Engine
) -> None:
    engine = role_engine(service)
    seq = _append(engine, actor=service, service=service)
    with owner_engine.connect() as conn:
        stamped = conn.execute(text("SELECT db_role FROM audit_event WHERE seq = :s"),
                               {"s": seq}).scalar_one()
    assert stamped == f"triloop_{service}"  # stated by the database, not by the writer
    for sql in (
        "UPDATE audit_event SET action = 'forged' WHERE seq = :s",
        "DELETE FROM audit_event WHERE seq = :s",
    ):
        with pytest.raises(DBAPIError) as caught, engine.begin() as conn:
            conn.execute(text(sql), {"s": seq})
        assert "permission denied" in str(caught.value.orig)


def test_trigger_refuses_update_delete_truncate_even_for_the_owner(owner_engine: Engine) -> None:
    seq = _append(owner_engine)
    for sql in (
        "UPDATE audit_event SET action = 'forged' WHERE seq = :s",
        "DELETE FROM audit_event WHERE seq = :s",
        "TRUNCATE audit_event",
    ):
        with pytest.raises(DBAPIError) as caught, owner_engine.begin() as conn:
            conn.execute(text(sql), {"s": seq})
        assert "append-only" in str(caught.value.orig)


def test_insert_that_does_not_extend_the_head_is_refused(owner_engine: Engine) -> None:
    _append(owner_engine)
    with pytest.raises(DBAPIError) as caught, owner_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO audit_event (seq, action, decision, prev_hash, hash) "
                "VALUES (1, 'fork', 'allow', :z, 'forged')"
            ),
            {"z": "0" * 64},
        )
    assert "does not extend the chain head" in str(caught.value.orig)


def test_eight_concurrent_writers_make_one_unbroken_chain(
    role_engine: Callable[[str], Engine],
) -> None:
    services = ["execution", "learning", "governance", "web"] * 2
    errors: list[BaseException] = []

    def writer(service: str) -> None:
        try:
            for i in range(25):
                _append(role_engine(service), actor=service, service=service, i=i)
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(s,)) for s in services]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    report = verify_chain(role_engine("web"))
    assert report.ok, report
    assert report.checked >= 200


def test_tampered_row_is_found_by_verify(owner_engine: Engine, database_url: str) -> None:
    seqs = [_append(owner_engine, n=i) for i in range(3)]
    target = seqs[1]
    # A superuser disabling the trigger can edit a row; the chain still tells.
    with owner_engine.begin() as conn:
        conn.execute(text("ALTER TABLE audit_event DISABLE TRIGGER audit_event_no_update_delete"))
        conn.execute(
            text("UPDATE audit_event SET payload = '{\"n\": 99}' WHERE seq = :s"), {"s": target}
        )
        conn.execute(text("ALTER TABLE audit_event ENABLE TRIGGER audit_event_no_update_delete"))
    try:
        report = verify_chain(owner_engine)
        assert not report.ok
        assert report.broken_seq == target
        assert report.problem == "contents do not match the stored hash"
    finally:
        # Put the row back so other tests see a valid chain.
        with owner_engine.begin() as conn:
            conn.execute(
                text("ALTER TABLE audit_event DISABLE TRIGGER audit_event_no_update_delete")
            )
            conn.execute(
                text("UPDATE audit_event SET payload = '{\"n\": 1}' WHERE seq = :s"),
                {"s": target},
            )
            conn.execute(
                text("ALTER TABLE audit_event ENABLE TRIGGER audit_event_no_update_delete")
            )
    assert verify_chain(owner_engine).ok


@pytest.mark.parametrize("service", ["execution", "learning", "governance", "web"])
def test_no_service_role_inserts_directly_or_holds_the_chain_lock(
    role_engine: Callable[[str], Engine], service: str
) -> None:
    engine = role_engine(service)
    for sql in ("INSERT INTO audit_event (seq, action, decision, prev_hash, hash) "
                "VALUES (999999, 'forged', 'allow', 'x', 'y')",
                "SELECT * FROM audit_chain_head FOR UPDATE"):
        with pytest.raises(DBAPIError) as caught, engine.begin() as conn:
            conn.execute(text(sql))
        assert "permission denied" in str(caught.value.orig)


def test_a_role_cannot_claim_another_service_in_its_row(role_engine: Callable[[str], Engine]
                                                        ) -> None:
    learning = role_engine("learning")
    with pytest.raises(DBAPIError) as caught, learning.begin() as conn:
        conn.execute(text(
            "SELECT triloop_audit_log('{\"service\": \"governance\"}', 'promote', '{}',"
            " 'allow', NULL, NULL, '{}')"))
    assert "writes only its own service's events" in str(caught.value.orig)


def test_the_old_advisory_lock_no_longer_stalls_appends(
    role_engine: Callable[[str], Engine],
) -> None:
    # A role holding the advisory lock the chain used to take stalls nobody now: appends
    # lock a row no service role may touch. lock_timeout turns a stall into an error.
    holder = role_engine("learning").connect()
    try:
        holder.execute(text("SELECT pg_advisory_lock(hashtext('triloop.audit_event'))"))
        with session_scope(role_engine("web")) as session:
            session.execute(text("SET LOCAL lock_timeout = '2s'"))
            append_event(session, actor={"service": "web"}, action="read",
                         resource={"kind": "task"}, decision="allow")
    finally:
        holder.execute(text("SELECT pg_advisory_unlock_all()"))
        holder.close()


def test_verify_names_an_actor_its_role_could_not_have_written() -> None:
    from datetime import UTC, datetime

    from triloop.audit import actor_role_mismatch
    from triloop.models import AuditEvent

    def event(service: str, role: str | None) -> AuditEvent:
        return AuditEvent(seq=1, at=datetime.now(UTC), actor={"service": service},
                          action="promote", resource={}, decision="allow", payload={},
                          prev_hash="0", hash="1", db_role=role)

    assert actor_role_mismatch(event("governance", "triloop_governance")) is None
    assert actor_role_mismatch(event("governance", "postgres")) is None  # the owner, set-up
    assert actor_role_mismatch(event("governance", None)) is None  # rows from before roles
    problem = actor_role_mismatch(event("governance", "triloop_learning"))
    assert problem is not None and "'triloop_learning'" in problem
