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


def _append(engine: Engine, action: str = "test.write", **payload: object) -> int:
    with session_scope(engine) as session:
        event = append_event(
            session,
            actor={"service": "execution"},
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
    role_engine: Callable[[str], Engine], service: str
) -> None:
    engine = role_engine(service)
    seq = _append(engine, service=service)
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
                _append(role_engine(service), service=service, i=i)
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
