"""People and tokens: admins create users (token shown once, stored hashed), others may not."""

from __future__ import annotations

import hashlib

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import Engine, text

from tests.factories import uid
from tests.factories_web import Person, assert_problem, console_cookie
from web.auth import SESSION_COOKIE, ConsoleSession

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


async def test_admin_creates_a_user_whose_token_works_and_is_stored_hashed(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, web_app: FastAPI
) -> None:
    name = uid("carol").lower()
    response = await api.post("/api/users", json={"name": name, "roles": ["operator"]},
                              headers=people["admin"].headers)
    assert response.status_code == 201, response.text
    token = response.json()["token"]
    with owner_engine.begin() as conn:
        stored = conn.execute(text(
            "SELECT t.token_hash, u.created_by, t.expires_at - t.created_at FROM app_user u "
            "JOIN api_token t ON t.user_name = u.name WHERE u.name=:n"), {"n": name}).one()
    assert stored[0] == hashlib.sha256(token.encode()).hexdigest() and token not in stored[0]
    assert stored[1] == people["admin"].name
    lifetime = web_app.state.services.settings.api_token_lifetime_s
    assert stored[2].total_seconds() == lifetime  # it expires
    me = await api.get("/api/me", headers={"Authorization": f"Bearer {token}"})
    # operator is a privileged role: pending until a second admin confirms (test_api_role_grants)
    assert me.json()["name"] == name and me.json()["roles"] == []
    assert [g["role"] for g in response.json()["pending_grants"]] == ["operator"]
    listing = await api.get("/api/users?limit=200", headers=people["admin"].headers)
    assert name in [u["name"] for u in listing.json()["items"]]
    assert "token" not in listing.text
    duplicate = await api.post("/api/users", json={"name": name, "roles": ["auditor"]},
                               headers=people["admin"].headers)
    assert_problem(duplicate, 409, "already exists")


@pytest.mark.parametrize(("body", "needle"), [
    ({"name": "Bad Name", "roles": ["operator"]}, "name"),
    ({"name": "dave", "roles": ["wizard"]}, "unknown role"),
    ({"name": "dave", "roles": []}, "roles"),
])
async def test_bad_user_input_is_422(
    api: httpx.AsyncClient, people: dict[str, Person], body: dict[str, object], needle: str
) -> None:
    response = await api.post("/api/users", json=body, headers=people["admin"].headers)
    assert_problem(response, 422, needle)


async def test_only_admins_manage_users(
    api: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    for who in ("operator", "auditor", "engineer"):
        response = await api.post("/api/users", json={"name": uid("x").lower(),
                                                      "roles": ["admin"]},
                                  headers=people[who].headers)
        assert_problem(response, 403)
    assert_problem(await api.get("/api/users", headers=people["operator"].headers), 403)


async def test_console_cookie_reads_the_api_but_changes_need_the_csrf_header(
    api: httpx.AsyncClient, people: dict[str, Person], web_app: FastAPI
) -> None:
    signer = web_app.state.services.signer
    cookie = console_cookie(web_app, people["auditor"], csrf="c-123")
    cookies = {"Cookie": f"{SESSION_COOKIE}={cookie}"}
    me = await api.get("/api/me", headers=cookies)
    assert me.status_code == 200 and me.json()["name"] == people["auditor"].name
    refused = await api.post("/api/audit/verify", headers=cookies)
    assert_problem(refused, 403, "X-CSRF-Token")
    allowed = await api.post("/api/audit/verify", headers={**cookies, "X-CSRF-Token": "c-123"})
    assert allowed.status_code == 200
    forged = signer.dump_session(ConsoleSession(user="nobody-" + people["auditor"].name,
                                                csrf="c"))
    assert_problem(await api.get("/api/me", headers={"Cookie": f"{SESSION_COOKIE}={forged}"}), 401)
