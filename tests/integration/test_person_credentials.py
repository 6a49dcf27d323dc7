"""Issue 32, route 4: only a person's own secret, checked inside the database, speaks for them.

Each attack runs as ``triloop_web`` with its own password (``Settings.role_url('web')``),
the credential the issue names: it can read every token digest and it holds the
cookie-signing key, yet it cannot write a decision in an operator's name, mint that
operator a token or a console session, change anyone's roles, or have a loop carry out
one decision twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError

from tests.factories import make_person, person_token, record_decision, uid
from triloop.config import Settings
from triloop.db import session_scope
from triloop.decisions import DecisionRefused, load_decision
from triloop.statuses import DecisionKind

pytestmark = pytest.mark.integration

DECIDE = "SELECT triloop_record_decision(:c, 'rollback', 'production', 'rollback', 'x', '{}')"


@pytest.fixture
def web(settings: Settings) -> Engine:
    """The web role logged in with its own password, as the attacker did."""
    engine = create_engine(settings.role_url("web"))
    yield engine
    engine.dispose()


def _refused(engine: Engine, sql: str, **params: object) -> str:
    with pytest.raises(DBAPIError) as caught, engine.begin() as conn:
        conn.execute(text(sql), params)
    return str(caught.value.orig)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def test_the_web_role_cannot_insert_a_decision_in_an_operators_name(
    web: Engine, owner_engine: Engine,
) -> None:
    olga = make_person(owner_engine, uid("olga-"), ["operator"])
    problem = _refused(web, "INSERT INTO human_decision (id, kind, subject, decision, user_name)"
                       " VALUES (:i, 'rollback', 'production', 'rollback', :u)",
                       i=uid("dec-"), u=olga)
    assert "permission denied for table human_decision" in problem


def test_the_decision_function_refuses_a_missing_or_forged_secret(
    web: Engine, owner_engine: Engine,
) -> None:
    olga = make_person(owner_engine, uid("olga-"), ["operator"])
    token = person_token(owner_engine, olga)
    with web.connect() as conn:  # the web role may read digests: a digest is no credential
        digest = conn.execute(text("SELECT token_hash FROM api_token WHERE token_hash = :h"),
                              {"h": _digest(token)}).scalar_one()
    for forged in (None, "", "tl_guessed", digest, token + "x"):
        problem = _refused(web, DECIDE, c=forged)
        assert "credential" in problem, problem
    with owner_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM human_decision WHERE user_name = :u"),
                            {"u": olga}).scalar_one() == 0


def test_a_persons_own_token_records_their_decision_and_only_theirs(
    web: Engine, owner_engine: Engine,
) -> None:
    olga = make_person(owner_engine, uid("olga-"), ["operator"])
    mallory = make_person(owner_engine, uid("mallory-"), ["ml_engineer"])
    decided = record_decision(web, kind="rollback", subject="production", decision="rollback",
                              user=olga, credential=person_token(owner_engine, olga))
    # Naming olga is not possible at all: the person is whoever the secret belongs to.
    by_mallory = record_decision(web, kind="rollback", subject="production",
                                 decision="rollback", user=olga,
                                 credential=person_token(owner_engine, mallory))
    with owner_engine.connect() as conn:
        rows = dict(conn.execute(text(
            "SELECT id, user_name || '/' || recorded_by FROM human_decision WHERE id = ANY(:i)"),
            {"i": [decided, by_mallory]}).all())
    assert rows == {decided: f"{olga}/triloop_web", by_mallory: f"{mallory}/triloop_web"}


def test_a_console_session_is_made_only_from_the_persons_token(
    web: Engine, owner_engine: Engine,
) -> None:
    olga = make_person(owner_engine, uid("olga-"), ["operator"])
    token = person_token(owner_engine, olga)
    with web.connect() as conn:
        token_id = conn.execute(text("SELECT id FROM api_token WHERE token_hash = :h"),
                                {"h": _digest(token)}).scalar_one()
    # The web role cannot write a session row of its own, nor issue olga a token.
    assert "permission denied" in _refused(
        web, "INSERT INTO console_session (id, user_name, token_id, secret_hash, expires_at)"
        " VALUES ('s', :u, :t, :h, now() + interval '1 day')",
        u=olga, t=token_id, h=_digest("chosen"))
    assert "permission denied" in _refused(
        web, "INSERT INTO api_token (id, user_name, token_hash, created_by, expires_at)"
        " VALUES ('t', :u, :h, 'web', now() + interval '1 day')", u=olga, h=_digest("chosen"))
    mallory = make_person(owner_engine, uid("mallory-"), ["ml_engineer"])
    assert "may not issue a token" in _refused(
        web, "SELECT triloop_issue_token(:c, :u, :h, 'x', 3600)",
        c=person_token(owner_engine, mallory), u=olga, h=_digest("chosen"))
    assert "sign-in refused" in _refused(web, "SELECT * FROM triloop_sign_in(:t, 3600)",
                                         t=_digest(token))
    with web.begin() as conn:
        user, secret = conn.execute(text(
            "SELECT user_name, secret FROM triloop_sign_in(:t, 3600)"), {"t": token}).one()
    assert user == olga
    session_decision = record_decision(web, kind="rollback", subject="production",
                                       decision="rollback", user=olga, credential=secret)
    with owner_engine.connect() as conn:
        assert conn.execute(text("SELECT user_name FROM human_decision WHERE id = :i"),
                            {"i": session_decision}).scalar_one() == olga
    with web.begin() as conn:
        conn.execute(text("SELECT triloop_sign_out(:s)"), {"s": secret})
    assert "credential" in _refused(web, DECIDE, c=secret)  # an ended session speaks for no one


def test_the_web_role_cannot_change_roles_outside_a_confirmed_grant(
    web: Engine, owner_engine: Engine,
) -> None:
    mallory = make_person(owner_engine, uid("mallory-"), ["ml_engineer"])
    assert "permission denied" in _refused(
        web, "UPDATE app_user SET roles = '{operator}' WHERE name = :u", u=mallory)
    assert "only through a confirmed" in _refused(
        web, "INSERT INTO app_user (name, roles, created_by, disabled) VALUES (:u, '{operator}',"
        " 'web', false)", u=uid("eve-"))
    assert "permission denied" in _refused(
        web, "INSERT INTO role_grant (id, user_name, role, requested_by) VALUES (:i, :u,"
        " 'operator', 'admin1')", i=uid("g-"), u=mallory)
    # The grant functions stamp the admins from their own secrets: one admin cannot be both.
    ada = make_person(owner_engine, uid("ada-"), ["admin"])
    bob = make_person(owner_engine, uid("bob-"), ["admin"])
    ada_token, bob_token = person_token(owner_engine, ada), person_token(owner_engine, bob)
    with web.begin() as conn:
        grant = conn.execute(text("SELECT triloop_request_role_grant(:c, :u, 'operator')"),
                             {"c": ada_token, "u": mallory}).scalar_one()
    assert "role_grant_two_people" in _refused(
        web, "SELECT triloop_decide_role_grant(:c, :g, true)", c=ada_token, g=grant)
    assert "credential" in _refused(
        web, "SELECT triloop_decide_role_grant(:c, :g, true)", c=_digest(bob_token), g=grant)
    assert "is not an admin" in _refused(
        web, "SELECT triloop_decide_role_grant(:c, :g, true)",
        c=person_token(owner_engine, mallory), g=grant)
    with web.begin() as conn:
        conn.execute(text("SELECT triloop_decide_role_grant(:c, :g, true)"),
                     {"c": bob_token, "g": grant})
    with owner_engine.connect() as conn:
        roles, confirmed_by = conn.execute(text(
            "SELECT u.roles, g.confirmed_by FROM app_user u JOIN role_grant g ON g.user_name ="
            " u.name WHERE g.id = :g"), {"g": grant}).one()
    assert roles == ["ml_engineer", "operator"] and confirmed_by == bob


def test_a_decision_is_carried_out_once(
    web: Engine, owner_engine: Engine, role_engine: Callable[[str], Engine],
) -> None:
    olga = make_person(owner_engine, uid("olga-"), ["operator"])
    decision_id = record_decision(web, kind="rollback", subject="production",
                                  decision="rollback", user=olga, owner=owner_engine)
    governance = role_engine("governance")

    def carry_out(execution: str) -> None:
        with session_scope(governance) as session:
            load_decision(session, decision_id=decision_id, kind=DecisionKind.ROLLBACK,
                          subject="production", role="operator", execution=execution)

    carry_out("rollback-a/run-1/1")
    carry_out("rollback-a/run-1/1")  # a retry of the same activity execution
    for other in ("rollback-b/run-9/1", "rollback-a/run-2/1", "rollback-a/run-1/2"):
        with pytest.raises(DecisionRefused, match="a decision is used once"):
            carry_out(other)
    with owner_engine.connect() as conn:
        used = conn.execute(text("SELECT execution, used_by FROM decision_use"
                                 " WHERE decision_id = :d"), {"d": decision_id}).all()
    assert [tuple(u) for u in used] == [("rollback-a/run-1/1", "triloop_governance")]
    assert "permission denied" in _refused(
        governance, "DELETE FROM decision_use WHERE decision_id = :d", d=decision_id)
