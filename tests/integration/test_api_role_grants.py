"""Two-person role grants (issue 19 item 2): one admin asks, another confirms."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
import sqlalchemy.exc
from sqlalchemy import Engine, text

from tests.factories import uid
from tests.factories_web import Person, assert_problem, make_user
from triloop.config import ServiceName

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


def _audit(engine: Engine, grant_id: str) -> list[tuple[str, str, str]]:
    with engine.begin() as conn:
        rows = conn.execute(text(
            "SELECT action, decision, actor->>'user' FROM audit_event "
            "WHERE resource->>'kind' = 'role_grant' AND resource->>'id' = :g ORDER BY seq"),
            {"g": grant_id}).all()
    return [(r[0], r[1], r[2]) for r in rows]


async def _me(api: httpx.AsyncClient, token: str) -> list[str]:
    response = await api.get("/api/me", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    roles: list[str] = response.json()["roles"]
    return roles


async def test_a_privileged_role_is_pending_until_a_second_admin_confirms_it(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    first, second = people["admin"], make_user(owner_engine, "admin")
    name = uid("olga").lower()
    created = await api.post("/api/users", json={"name": name,
                                                 "roles": ["ml_engineer", "operator"]},
                             headers=first.headers)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["roles"] == ["ml_engineer"]  # the operator role is not active yet
    [pending] = body["pending_grants"]
    assert (pending["role"], pending["status"], pending["requested_by"]) == (
        "operator", "pending", first.name)
    assert await _me(api, body["token"]) == ["ml_engineer"]
    listed = await api.get("/api/role-grants?status=pending&limit=200", headers=second.headers)
    assert pending["id"] in [g["id"] for g in listed.json()["items"]]

    own = await api.post(f"/api/role-grants/{pending['id']}/confirm", headers=first.headers)
    assert_problem(own, 403, f"two-person rule: {first.name} requested this role grant")
    assert await _me(api, body["token"]) == ["ml_engineer"]

    confirmed = await api.post(f"/api/role-grants/{pending['id']}/confirm",
                               headers=second.headers)
    assert confirmed.status_code == 200, confirmed.text
    assert (confirmed.json()["status"], confirmed.json()["confirmed_by"]) == (
        "active", second.name)
    assert await _me(api, body["token"]) == ["ml_engineer", "operator"]
    again = await api.post(f"/api/role-grants/{pending['id']}/refuse", headers=second.headers)
    assert_problem(again, 409, "already active")
    assert _audit(owner_engine, pending["id"])[:2] == [
        ("confirm", "deny", first.name), ("confirm", "allow", second.name)]


async def test_a_refused_grant_never_becomes_a_role(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    first, second = people["admin"], make_user(owner_engine, "admin")
    person = make_user(owner_engine, "ml_engineer")
    asked = await api.post(f"/api/users/{person.name}/roles", json={"role": "auditor"},
                           headers=first.headers)
    assert asked.status_code == 201, asked.text
    twice = await api.post(f"/api/users/{person.name}/roles", json={"role": "auditor"},
                           headers=second.headers)
    assert_problem(twice, 409, "already pending")
    refused = await api.post(f"/api/role-grants/{asked.json()['id']}/refuse",
                             headers=second.headers)
    assert refused.json()["status"] == "refused", refused.text
    assert await _me(api, person.token) == ["ml_engineer"]


async def test_only_admins_ask_for_privileged_roles(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    person = make_user(owner_engine, "ml_engineer")
    for who in ("operator", "auditor", "engineer"):
        response = await api.post(f"/api/users/{person.name}/roles", json={"role": "admin"},
                                  headers=people[who].headers)
        assert_problem(response, 403)
    plain = await api.post(f"/api/users/{person.name}/roles", json={"role": "ml_engineer"},
                           headers=people["admin"].headers)
    assert_problem(plain, 422, "needs no grant")
    unknown = await api.post(f"/api/users/{person.name}/roles", json={"role": "wizard"},
                             headers=people["admin"].headers)
    assert_problem(unknown, 422, "is not a role")
    nobody = await api.post("/api/users/nobody-here/roles", json={"role": "operator"},
                            headers=people["admin"].headers)
    assert_problem(nobody, 404)
    held = await api.post(f"/api/users/{people['operator'].name}/roles",
                          json={"role": "operator"}, headers=people["admin"].headers)
    assert_problem(held, 409, "already holds")


def test_the_database_refuses_a_grant_decided_by_its_requester(
    role_engine: Callable[[ServiceName], Engine], owner_engine: Engine
) -> None:
    person = make_user(owner_engine, "ml_engineer")
    web = role_engine("web")
    # The web role writes no grant row itself (issue 32, route 4): requests and decisions
    # go through functions that stamp each admin from their own credential.
    for sql in ("INSERT INTO role_grant (id, user_name, role, requested_by) VALUES (:g, :u,"
                " 'operator', 'ann')",
                "UPDATE role_grant SET status='active', confirmed_by='bea', confirmed_at=now()"
                " WHERE user_name = :u AND id = :g"):
        with pytest.raises(sqlalchemy.exc.ProgrammingError, match="permission denied"):
            with web.begin() as conn:
                conn.execute(text(sql), {"g": uid("g-"), "u": person.name})
    # And the table's own rules hold for every writer, the owner and those functions included.
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="role_grant_two_people"):
        with owner_engine.begin() as conn:  # a forged row: requested and confirmed by one admin
            conn.execute(text(
                "INSERT INTO role_grant (id, user_name, role, requested_by, confirmed_by,"
                " confirmed_at, status) VALUES (:g, :u, 'operator', 'ann', 'ann', now(),"
                " 'active')"), {"g": uid("g-"), "u": person.name})
    grant_id = uid("g-")
    with owner_engine.begin() as conn:
        conn.execute(text("INSERT INTO role_grant (id, user_name, role, requested_by) "
                          "VALUES (:g, :u, 'operator', 'ann')"), {"g": grant_id, "u": person.name})
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="role_grant_two_people"):
        with owner_engine.begin() as conn:
            conn.execute(text("UPDATE role_grant SET status='active', confirmed_by='ann',"
                              " confirmed_at=now() WHERE id=:g"), {"g": grant_id})
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE role_grant SET status='refused', confirmed_by='bea',"
                          " confirmed_at=now() WHERE id=:g"), {"g": grant_id})
    with pytest.raises(sqlalchemy.exc.DBAPIError, match="only a pending grant"):
        with owner_engine.begin() as conn:  # a decided grant stays decided
            conn.execute(text("UPDATE role_grant SET status='active' WHERE id=:g"),
                         {"g": grant_id})


async def test_grants_are_listed_a_page_at_a_time(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    person = make_user(owner_engine, "ml_engineer")
    asked = []
    for role in ("operator", "auditor", "admin"):
        response = await api.post(f"/api/users/{person.name}/roles", json={"role": role},
                                  headers=people["admin"].headers)
        asked.append(response.json()["id"])
    seen: list[str] = []
    cursor = ""
    while True:
        page = (await api.get(f"/api/role-grants?status=pending&limit=2{cursor}",
                              headers=people["auditor"].headers)).json()
        seen += [g["id"] for g in page["items"]]
        if not page["next_cursor"]:
            break
        cursor = f"&cursor={page['next_cursor']}"
    assert len(seen) == len(set(seen)) and set(asked) <= set(seen)  # each once, none lost
    refused = await api.get("/api/role-grants", headers=people["operator"].headers)
    assert_problem(refused, 403)
