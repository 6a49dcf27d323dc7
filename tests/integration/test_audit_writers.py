"""Issue 32, route 8: the audit log can no longer be stalled, poisoned or mislabelled.

Each attack uses one service role's own password. One call appends (``triloop_audit_log``):
the database takes the head, computes the hash and appends, so there is no head to hold
between calls and no hash to choose; a transaction that sits on the head past
``lock_timeout`` while another role waits is ended. A service role may not name a person;
the web role names one only with that person's secret. A lock timeout reads as one.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from tests.factories import make_person, person_token, uid
from triloop.audit import append_event, verify_chain
from triloop.db import session_scope
from web.problems import as_problem

pytestmark = pytest.mark.integration

# The verifier (0021) is a service like the others: it names only itself.
SERVICES = ["execution", "learning", "governance", "web", "verifier"]
LOG = ("SELECT seq, hash FROM triloop_audit_log(CAST(:a AS jsonb), 'test.write', '{}',"
       " 'record', NULL, NULL, '{}', :c)")


def _refused(engine: Engine, sql: str, **params: object) -> str:
    with pytest.raises(DBAPIError) as caught, engine.begin() as conn:
        conn.execute(text(sql), params)
    return str(caught.value.orig)


@pytest.mark.parametrize("service", SERVICES)
def test_no_role_can_take_the_head_or_choose_a_hash(
    role_engine: Callable[[str], Engine], service: str, owner_engine: Engine,
) -> None:
    engine = role_engine(service)
    for sql in ("SELECT * FROM triloop_audit_head()",
                "SELECT triloop_audit_append(1, now(), '{}', 'x', '{}', 'allow', NULL, NULL,"
                " '{}', 'p', 'h', 'r')"):
        assert "does not exist" in _refused(engine, sql)
    # Whatever the caller puts in the row, the hash is PostgreSQL's, and verify agrees.
    actor = json.dumps({"service": service, "hash": "f" * 64})
    with engine.begin() as conn:
        seq, stored = conn.execute(text(LOG), {"a": actor, "c": None}).one()
    with owner_engine.connect() as conn:
        hashed_in_db = conn.execute(text("SELECT hashed_in_db FROM audit_event WHERE seq = :s"),
                                    {"s": seq}).scalar_one()
    assert hashed_in_db and stored != "f" * 64
    assert verify_chain(owner_engine).ok


def test_a_role_holding_the_head_is_ended_and_nobody_else_stalls(
    role_engine: Callable[[str], Engine], owner_engine: Engine,
) -> None:
    holder = role_engine("learning").connect()
    holder_transaction = holder.begin()
    holder.execute(text(LOG), {"a": json.dumps({"service": "learning"}), "c": None})
    try:
        # Governance's append waits past lock_timeout once, ends the holder, and is written.
        with session_scope(role_engine("governance")) as session:
            event = append_event(session, actor={"service": "governance"}, action="rollback",
                                 resource={"kind": "deployment", "id": "production"},
                                 decision="record")
        with pytest.raises(DBAPIError):  # the holder's connection was ended
            holder_transaction.commit()
    finally:
        holder.invalidate()
        holder.close()
    with owner_engine.connect() as conn:
        written = conn.execute(text("SELECT actor->>'service' FROM audit_event WHERE seq = :s"),
                               {"s": event.seq}).scalar_one()
    assert written == "governance"
    assert verify_chain(owner_engine).ok


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_role_writes_only_its_own_service_events(
    role_engine: Callable[[str], Engine], owner_engine: Engine, service: str,
) -> None:
    other = "governance" if service != "governance" else "web"
    problem = _refused(role_engine(service), LOG, a=json.dumps({"service": other}), c=None)
    assert f"writes only its own service's events, not {other}" in problem
    assert verify_chain(owner_engine).ok


@pytest.mark.parametrize("service", ["execution", "learning", "governance", "verifier"])
def test_a_service_role_may_not_name_a_person(
    role_engine: Callable[[str], Engine], owner_engine: Engine, service: str,
) -> None:
    olga = make_person(owner_engine, uid("olga-"), ["operator"])
    actor = json.dumps({"service": service, "user": olga, "roles": ["operator"]})
    problem = _refused(role_engine(service), LOG, a=actor, c=person_token(owner_engine, olga))
    assert "only the web service names a person" in problem
    assert verify_chain(owner_engine).ok


def test_the_web_role_names_a_person_only_with_their_secret(
    role_engine: Callable[[str], Engine], owner_engine: Engine,
) -> None:
    web = role_engine("web")
    olga = make_person(owner_engine, uid("olga-"), ["operator"])
    mallory = make_person(owner_engine, uid("mallory-"), ["ml_engineer"])
    as_olga = json.dumps({"service": "web", "user": olga, "roles": ["operator"]})
    token = person_token(owner_engine, olga)
    assert "no credential was presented" in _refused(web, LOG, a=as_olga, c=None)
    assert "is not " in _refused(web, LOG, a=as_olga, c=person_token(owner_engine, mallory))
    assert "does not hold every role" in _refused(
        web, LOG, a=json.dumps({"service": "web", "user": olga, "roles": ["admin"]}), c=token)
    with web.begin() as conn:
        conn.execute(text(LOG), {"a": as_olga, "c": token})
    assert verify_chain(owner_engine).ok


def test_a_lock_timeout_is_answered_as_a_lock_timeout(
    role_engine: Callable[[str], Engine], owner_engine: Engine,
) -> None:
    with owner_engine.connect() as holder, holder.begin():
        holder.execute(text("LOCK TABLE deployment IN ACCESS EXCLUSIVE MODE"))
        with pytest.raises(DBAPIError) as caught, role_engine("web").begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '100ms'"))
            conn.execute(text("SELECT count(*) FROM deployment"))
    problem = as_problem(caught.value)
    assert (problem.status, problem.title) == (503, "Database lock timeout")
    assert "lock timeout" in problem.detail and "cannot be reached" not in problem.detail
