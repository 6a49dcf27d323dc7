"""The audit log for auditors: reads in an append-only access log of their own, the
outcome of each allowed action next to its authorization, filters by kind, decision,
actor and time range, and CSV/JSON export (API and console)."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from tests.factories_web import Person, assert_problem, make_promotion

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


async def _events(api: httpx.AsyncClient, auditor: Person, **params: str) -> list[dict]:
    response = await api.get("/api/audit/events", params={"limit": "50", **params},
                             headers=auditor.headers)
    assert response.status_code == 200, response.text
    items: list[dict] = response.json()["items"]
    return items


async def test_an_allowed_action_that_was_refused_reads_as_refused(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            status="rejected")
    auditor = people["auditor"]
    refused = await api.post(f"/api/promotions/{seeded.promotion_id}/sign-audit",
                             headers=auditor.headers, json={"comment": "evidence ok"})
    assert_problem(refused, 409, "decisions need it open")
    events = [e for e in await _events(api, people["auditor_operator"], kind="promotion",
                                       actor=auditor.name, view="chain")
              if e["resource"].get("id") == seeded.promotion_id]
    allowed = next(e for e in events if e["decision"] == "allow")
    assert allowed["outcome"] == "refused" and allowed["outcome_status"] == 409
    assert "decisions need it open" in allowed["outcome_detail"]
    assert "decisions need it open" in allowed["reason"]
    # The refusal is the person's own row: a deny with the reason (issue 32, route 8).
    record = next(e for e in events if e["decision"] == "deny")
    assert record["decision_id"] == allowed["decision_id"] and record["seq"] > allowed["seq"]
    assert record["payload"]["outcome"] == "refused"
    assert "decisions need it open" in record["payload"]["reasons"][0]


async def test_reads_go_to_an_append_only_access_log(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    role_engine: object,
) -> None:
    reader = people["operator2"]
    await api.get("/api/deployments", headers=reader.headers)
    chain = await _events(api, people["auditor"], actor=reader.name, kind="deployment")
    assert not [e for e in chain if e["decision"] == "allow" and e["action"] == "read"]
    access = await api.get("/api/audit/access", params={"actor": reader.name},
                           headers=people["auditor"].headers)
    assert access.json()["items"][0]["resource"]["kind"] == "deployment"
    web = role_engine("web")  # type: ignore[operator]
    for statement in ("UPDATE access_event SET action = 'x'", "DELETE FROM access_event"):
        for engine in (owner_engine, web):
            with pytest.raises(DBAPIError), engine.begin() as conn:
                conn.execute(text(statement))
    # The engineer may not read the log of who read what.
    assert_problem(await api.get("/api/audit/access", headers=people["engineer"].headers), 403)


async def test_filters_by_time_range_and_decision(
    api: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    await api.get("/api/audit/events", headers=people["engineer"].headers)  # a denial
    auditor = people["auditor"]
    now = datetime.now(UTC)
    recent = await _events(api, auditor, decision="deny",
                           since=(now - timedelta(minutes=5)).isoformat())
    assert recent and all(e["decision"] == "deny" for e in recent)
    assert not await _events(api, auditor, since=(now + timedelta(days=1)).isoformat())
    assert not await _events(api, auditor, until="2000-01-01T00:00:00Z")
    assert_problem(await api.get("/api/audit/events", params={"decision": "maybe"},
                                 headers=auditor.headers), 422, "decision")
    assert_problem(await api.get("/api/audit/events", params={"since": "yesterday"},
                                 headers=auditor.headers), 422, "since")


async def test_export_as_csv_and_json(api: httpx.AsyncClient, people: dict[str, Person]) -> None:
    await api.get("/api/audit/events", headers=people["engineer"].headers)  # a denial
    auditor = people["auditor"].headers
    as_csv = await api.get("/api/audit/events/export",
                           params={"format": "csv", "decision": "deny", "limit": "20"},
                           headers=auditor)
    assert as_csv.status_code == 200 and as_csv.headers["content-type"].startswith("text/csv")
    assert "attachment" in as_csv.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert rows and all(r["decision"] == "deny" for r in rows)
    seqs = [int(r["seq"]) for r in rows]
    assert seqs == sorted(seqs)  # oldest first, as the chain was written
    as_json = await api.get("/api/audit/events/export",
                            params={"format": "json", "decision": "deny", "limit": "20"},
                            headers=auditor)
    assert [e["seq"] for e in as_json.json()] == seqs
    assert_problem(await api.get("/api/audit/events/export", params={"format": "xml"},
                                 headers=auditor), 422)
    assert_problem(await api.get("/api/audit/events/export",
                                 headers=people["engineer"].headers), 403)


async def test_the_console_audit_page_filters_and_links_the_export(
    api: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    form = await api.get("/login")
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
    assert csrf is not None
    signed_in = await api.post("/login", data={"token": people["auditor"].token,
                                               "csrf_token": csrf.group(1), "next": "/"})
    assert signed_in.status_code == 303, signed_in.text
    page = await api.get("/audit", params={"decision": "deny", "kind": "audit_event"},
                         headers={"Accept": "text/html"})
    api.cookies.clear()
    assert page.status_code == 200, page.text
    for field in ('name="kind"', 'name="decision"', 'name="actor"', 'name="since"',
                  'name="until"'):
        assert field in page.text
    assert "/api/audit/events/export?format=csv&amp;" in page.text
    assert "decision=deny" in page.text and '<option value="deny" selected>' in page.text
