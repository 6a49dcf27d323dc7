"""A NUL character in any request field is refused with 422, and the attempt is still audited.

PostgreSQL cannot store U+0000: before, the audit write failed and the attempt left
no row. Each request here must leave exactly the row of its policy decision, with
the NUL shown as ``\\u0000`` and the refused field named in the payload.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text

from tests.factories_web import assert_problem, make_promotion, make_user

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


def _rows_of(engine: Engine, user: str) -> list[dict[str, Any]]:
    with engine.begin() as conn:
        rows = conn.execute(text(
            "SELECT action, resource, decision, payload FROM audit_event "
            "WHERE actor->>'user' = :u ORDER BY seq"), {"u": user}).mappings().all()
    return [dict(row) for row in rows]


@pytest.mark.parametrize(("method", "path", "body", "field", "action"), [
    ("GET", "/api/runs/run%00x", None, "path parameter run_id", "read"),
    # (status is an enum now: a NUL there fails the schema before any policy question)
    ("GET", "/api/runs?submitted_by=al%00ice", None, "query parameter submitted_by", "read"),
    ("POST", "/api/runs/run%00x/cancel", {"reason": "r"}, "path parameter run_id", "cancel"),
    ("POST", "/api/runs/{run}/pause", {"reason": "a\u0000b"}, "field body.reason", "pause"),
    ("POST", "/api/promotions/p%00/approve", {"comment": "c"}, "path parameter promotion_id",
     "approve"),
    ("POST", "/api/tokens", {"label": "\u0000"}, "field body.label", "create"),
    ("POST", "/api/tokens/t%00/revoke", None, "path parameter token_id", "revoke"),
    ("GET", "/api/audit/events?actor=%00", None, "query parameter actor", "read"),
])
async def test_a_nul_anywhere_is_refused_and_the_attempt_audited(
    api: httpx.AsyncClient, owner_engine: Engine, method: str, path: str,
    body: dict[str, str] | None, field: str, action: str,
) -> None:
    person = make_user(owner_engine, "ml_engineer", "operator", "auditor")
    run = make_promotion(owner_engine, submitted_by=person.name).run_id
    before = len(_rows_of(owner_engine, person.name))
    response = await api.request(method, path.format(run=run), json=body,
                                 headers=person.headers)
    assert_problem(response, 422, field, "NUL character")
    rows = _rows_of(owner_engine, person.name)[before:]
    assert len(rows) == 1, rows
    (row,) = rows
    assert row["action"] == action and row["decision"] in ("allow", "deny")
    assert row["payload"]["context"]["refused_input"].startswith(field)
    if "%00" in path.split("?")[0]:
        assert "\\u0000" in row["resource"]["id"]


async def test_a_nul_in_a_console_form_is_refused_and_audited(
    api: httpx.AsyncClient, owner_engine: Engine, web_app: Any
) -> None:
    from tests.factories_web import console_cookie
    from web.auth import SESSION_COOKIE

    person = make_user(owner_engine, "operator")
    seeded = make_promotion(owner_engine, submitted_by=make_user(owner_engine, "ml_engineer").name)
    cookie = console_cookie(web_app, person, csrf="c1")
    before = len(_rows_of(owner_engine, person.name))
    response = await api.post(
        f"/promotions/{seeded.promotion_id}/approve",
        data={"csrf_token": "c1", "comment": "looks\u0000fine"},
        headers={"Cookie": f"{SESSION_COOKIE}={cookie}", "Accept": "application/json"})
    assert response.status_code == 422 and "NUL character" in response.text
    (row,) = _rows_of(owner_engine, person.name)[before:]
    assert row["action"] == "approve"
    assert row["payload"]["context"]["refused_input"].startswith("form field comment")
