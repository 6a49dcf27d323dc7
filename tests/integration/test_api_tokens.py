"""API tokens expire and can be listed and revoked by their owner or an admin (audited)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import Engine, text

from tests.factories_web import Person, add_token, assert_problem, console_cookie, make_user
from web.auth import SESSION_COOKIE, ConsoleSession, new_token

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_challenge(response: httpx.Response, *needles: str) -> dict[str, Any]:
    """A 401 problem carrying the Bearer challenge of RFC 6750."""
    body = assert_problem(response, 401, *needles)
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith("Bearer "), challenge
    return body


def _audit(engine: Engine, token_id: str) -> list[tuple[str, str, str]]:
    with engine.begin() as conn:
        rows = conn.execute(text(
            "SELECT action, decision, actor->>'user' FROM audit_event "
            "WHERE resource->>'kind' = 'api_token' AND resource->>'id' = :t ORDER BY seq"),
            {"t": token_id}).all()
    return [(r[0], r[1], r[2]) for r in rows]


async def test_owner_issues_lists_and_revokes_their_token(
    api: httpx.AsyncClient, owner_engine: Engine, web_app: FastAPI
) -> None:
    me = make_user(owner_engine, "ml_engineer")
    issued = await api.post("/api/tokens", json={"label": "laptop"}, headers=me.headers)
    assert issued.status_code == 201, issued.text
    fresh = issued.json()
    lifetime = web_app.state.services.settings.api_token_lifetime_s
    assert fresh["state"] == "active" and fresh["user"] == me.name and fresh["label"] == "laptop"
    assert (await api.get("/api/me", headers=_bearer(fresh["token"]))).status_code == 200
    shorter = await api.post("/api/tokens", json={"lifetime_s": 10 * lifetime},
                             headers=me.headers)
    assert shorter.status_code == 201  # asking for longer than the service allows is capped
    with owner_engine.begin() as conn:
        span = conn.execute(text("SELECT expires_at - created_at FROM api_token WHERE id=:i"),
                            {"i": shorter.json()["id"]}).scalar_one()
    assert span.total_seconds() == lifetime

    listing = await api.get("/api/tokens", headers=me.headers)
    assert listing.status_code == 200
    assert {t["id"] for t in listing.json()["items"]} >= {fresh["id"], shorter.json()["id"]}
    assert "token_hash" not in listing.text and fresh["token"] not in listing.text

    revoked = await api.post(f"/api/tokens/{fresh['id']}/revoke", headers=me.headers)
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["state"] == "revoked" and revoked.json()["revoked_by"] == me.name
    assert_challenge(await api.get("/api/me", headers=_bearer(fresh["token"])), "revoked")
    again = await api.post(f"/api/tokens/{fresh['id']}/revoke", headers=me.headers)
    assert_problem(again, 409, "already revoked")
    assert ("revoke", "allow", me.name) in _audit(owner_engine, fresh["id"])


async def test_only_the_owner_or_an_admin_may_see_or_revoke_a_token(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    victim = make_user(owner_engine, "operator")
    token_id = add_token(owner_engine, victim.name, spare := new_token())
    for who in ("engineer", "operator2"):
        refused = await api.post(f"/api/tokens/{token_id}/revoke", headers=people[who].headers)
        assert_problem(refused, 403)
        assert_problem(await api.get(f"/api/tokens?user={victim.name}",
                                     headers=people[who].headers), 403)
    assert (await api.get("/api/me", headers=_bearer(spare))).status_code == 200
    denied_by = {user for action, decision, user in _audit(owner_engine, token_id)
                 if action == "revoke" and decision == "deny"}
    assert denied_by == {people["engineer"].name, people["operator2"].name}

    admin = people["admin"]
    listed = await api.get(f"/api/tokens?user={victim.name}", headers=admin.headers)
    assert token_id in {t["id"] for t in listed.json()["items"]}
    revoked = await api.post(f"/api/tokens/{token_id}/revoke", headers=admin.headers)
    assert revoked.status_code == 200 and revoked.json()["revoked_by"] == admin.name
    assert_challenge(await api.get("/api/me", headers=_bearer(spare)), "revoked")
    assert ("revoke", "allow", admin.name) in _audit(owner_engine, token_id)
    assert_problem(await api.post("/api/tokens/no-such-token/revoke", headers=admin.headers),
                   404)


async def test_expired_unknown_and_missing_tokens_get_a_bearer_challenge(
    api: httpx.AsyncClient, owner_engine: Engine
) -> None:
    person = make_user(owner_engine, "auditor")
    old = new_token()
    add_token(owner_engine, person.name, old, expires_in="-1 second")
    body = assert_challenge(await api.get("/api/me", headers=_bearer(old)), "expired")
    assert "POST /api/tokens" in body["detail"]
    assert 'error="invalid_token"' in (await api.get("/api/me", headers=_bearer(old))).headers[
        "www-authenticate"]
    assert_challenge(await api.get("/api/me", headers=_bearer("tl_" + "x" * 40)), "unknown")
    api.cookies.clear()  # no credential at all: a console cookie another test left counts too
    assert_challenge(await api.get("/api/me"), "sign in")
    assert_challenge(await api.post("/api/audit/verify"), "sign in")


async def test_a_console_session_ends_with_the_token_it_was_opened_with(
    api: httpx.AsyncClient, owner_engine: Engine, web_app: FastAPI
) -> None:
    person = make_user(owner_engine, "auditor")
    token = new_token()
    token_id = add_token(owner_engine, person.name, token)
    cookie = console_cookie(web_app, Person(person.name, token))
    headers = {"Cookie": f"{SESSION_COOKIE}={cookie}"}
    assert (await api.get("/api/me", headers=headers)).status_code == 200
    # The signing key alone makes no session (issue 32, route 4): a cookie without the
    # secret the database made at sign-in, or with another one, is nobody's.
    signer = web_app.state.services.signer
    for secret in (None, "tls_" + "0" * 64):
        forged = signer.dump_session(ConsoleSession(user=person.name, csrf="c",
                                                    token_id=token_id, secret=secret))
        assert_challenge(await api.get("/api/me", headers={"Cookie": f"{SESSION_COOKIE}={forged}"}),
                         "sign in")
    revoked = await api.post(f"/api/tokens/{token_id}/revoke", headers=_bearer(token))
    assert revoked.status_code == 200
    assert_challenge(await api.get("/api/me", headers=headers), "sign in")
