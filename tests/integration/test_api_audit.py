"""The audit log through the API: every request's decision is there, filters, and verification."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import Engine, text

from tests.factories_web import Person, assert_problem

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


async def test_reads_and_denials_are_audited_with_the_person(
    api: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    engineer = people["engineer2"]
    await api.get("/api/tasks", headers=engineer.headers)
    await api.get("/api/audit/events", headers=engineer.headers)  # denied, still audited
    response = await api.get("/api/audit/events", params={"actor": engineer.name, "limit": 5},
                             headers=people["auditor"].headers)
    assert response.status_code == 200
    events = response.json()["items"]
    assert events[0]["action"] == "read" and events[0]["resource"]["kind"] == "audit_event"
    assert events[0]["decision"] == "deny" and events[0]["payload"]["reasons"]
    assert events[0]["actor"] == {"service": "web", "user": engineer.name,
                                  "roles": ["ml_engineer"]}
    # The allowed read is not a decision for the chain: it is in the access log.
    assert all(e["decision"] != "allow" or e["action"] != "read" for e in events)
    access = await api.get("/api/audit/access", params={"actor": engineer.name, "limit": 5},
                           headers=people["auditor"].headers)
    reads = access.json()["items"]
    assert reads[0]["resource"]["kind"] == "task" and reads[0]["db_role"] == "triloop_web"
    assert reads[0]["actor"] == {"service": "web", "user": engineer.name,
                                 "roles": ["ml_engineer"]}
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs, reverse=True)


async def test_filters_by_action_kind_and_decision(
    api: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    await api.get("/api/runs", headers=people["admin"].headers)  # a denial
    response = await api.get("/api/audit/events",
                             params={"kind": "training_run", "decision": "deny",
                                     "action": "read", "limit": 3},
                             headers=people["operator"].headers)
    items = response.json()["items"]
    assert items and all(e["resource"]["kind"] == "training_run" and e["decision"] == "deny"
                         for e in items)


async def test_a_time_filter_that_is_a_number_is_a_422_naming_it(
    api: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    # pydantic would read -3589121 as a Unix timestamp and answer 200 (schemathesis found it).
    for path in ("/api/audit/events", "/api/audit/access"):
        for name in ("since", "until"):
            response = await api.get(path, params={name: "-3589121"},
                                     headers=people["auditor"].headers)
            assert response.status_code == 422, (path, name, response.text)
            assert name in response.text and "ISO 8601" in response.text
    fine = await api.get("/api/audit/access", params={"until": "2026-12-01T00:00:00Z"},
                         headers=people["auditor"].headers)
    assert fine.status_code == 200


async def test_verify_reports_an_intact_chain_then_a_tampered_row(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    auditor = people["auditor"].headers
    report = (await api.post("/api/audit/verify", headers=auditor)).json()
    assert report["ok"] is True and report["checked"] > 0
    with owner_engine.begin() as conn:
        seq, payload = conn.execute(text(
            "SELECT seq, payload::text FROM audit_event ORDER BY seq DESC LIMIT 1")).one()
    try:
        _set_payload(owner_engine, seq, '{"forged": true}')
        broken = (await api.post("/api/audit/verify", headers=auditor)).json()
        assert broken["ok"] is False and broken["broken_seq"] == seq
        assert "hash" in broken["problem"]
    finally:
        _set_payload(owner_engine, seq, payload)


def _set_payload(engine: Engine, seq: int, payload: str) -> None:
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE audit_event DISABLE TRIGGER audit_event_no_update_delete"))
        conn.execute(text("UPDATE audit_event SET payload = CAST(:p AS jsonb) WHERE seq = :s"),
                     {"p": payload, "s": seq})
        conn.execute(text("ALTER TABLE audit_event ENABLE TRIGGER audit_event_no_update_delete"))


async def test_only_auditors_verify(api: httpx.AsyncClient, people: dict[str, Person]) -> None:
    for who in ("engineer", "operator", "admin"):
        assert_problem(await api.post("/api/audit/verify", headers=people[who].headers), 403)
