"""The audit log for people (issue 28): one row per act with its outcome and reason, a
person's acts and the refusals a loop recorded about their decisions, traffic kept apart,
kinds and actions from fixed vocabularies, time filters that are times, and ``triloop audit
verify`` through the API with the person's token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from sqlalchemy import Engine
from typer.testing import CliRunner

from tests.factories import record_decision, uid
from tests.factories_web import Person, assert_problem, make_promotion, make_user
from triloop.audit import append_event
from triloop.config import Settings, get_settings
from triloop.db import session_scope
from triloop.decisions import audit_refusal

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures", "tests.integration.cli_app"]


def _seed_day(engine: Engine, person: Person) -> dict[str, str]:
    """Traffic, an approve allowed then refused (two rows, one decision id), and governance's
    refusal of a decision the person recorded."""
    seeded = make_promotion(engine, submitted_by="someone-else")
    actor = {"service": "web", "user": person.name, "roles": ["operator"]}
    resource = {"kind": "promotion", "id": seeded.promotion_id}
    decision_id = uid("opa-")
    with session_scope(engine) as session:
        for _ in range(5):
            append_event(session, actor=actor, action="create", decision="allow",
                         decision_id=uid("opa-"), resource={"kind": "trajectory"},
                         payload={"reasons": []})
        append_event(session, actor=actor, action="approve", decision="allow",
                     decision_id=decision_id, resource=resource, payload={"reasons": []})
        append_event(session, actor=actor, action="approve", decision="deny",
                     decision_id=decision_id, resource=resource,
                     payload={"outcome": "refused", "status": 409, "detail": "not waiting",
                              "reasons": ["not waiting for an approval"]})
    human = record_decision(engine, kind="approval", subject=seeded.promotion_id,
                            decision="approve", user=person.name)
    audit_refusal(engine, service="governance", action="approve", resource=resource,
                  decision_id=human, reason="their role is newer than the promotion")
    return {"promotion_id": seeded.promotion_id, "decision_id": decision_id}


async def _items(api: httpx.AsyncClient, who: Person, **params: str) -> list[dict[str, Any]]:
    response = await api.get("/api/audit/events", params={"limit": "100", **params},
                             headers=who.headers)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


async def test_one_row_per_act_with_its_outcome_and_reason(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    person = make_user(owner_engine, "operator")
    seeded = _seed_day(owner_engine, person)
    acts = await _items(api, people["auditor"], person=person.name)
    # The refusal governance recorded, then the approve with its outcome folded in.
    assert [(e["actor"].get("user") or e["actor"]["service"], e["action"]) for e in acts] == [
        ("governance", "approve"), (person.name, "approve")]
    refusal, approve = acts
    assert refusal["decision"] == "deny" and "newer than the promotion" in refusal["reason"]
    assert approve["decision"] == "allow" and approve["outcome"] == "refused"
    assert approve["outcome_status"] == 409 and approve["reason"] == "not waiting for an approval"
    # Every row is still there in the chain view, and traffic when asked.
    chain = await _items(api, people["auditor"], person=person.name, view="chain")
    assert sum(e["decision_id"] == seeded["decision_id"] for e in chain) == 2
    assert len(chain) == 8
    with_traffic = await _items(api, people["auditor"], person=person.name, traffic="true")
    assert len(with_traffic) == 7
    # The export and the CLI show the reason too.
    exported = await api.get("/api/audit/events/export", params={
        "format": "csv", "person": person.name}, headers=people["auditor"].headers)
    assert "reason" in exported.text.splitlines()[0]
    assert "not waiting for an approval" in exported.text


async def test_kinds_actions_and_times_are_words_and_times_or_a_422(
    api: httpx.AsyncClient, people: dict[str, Person],
) -> None:
    auditor = people["auditor"].headers
    for name, value in (("kind", "promotions"), ("action", "aprove")):
        assert_problem(await api.get("/api/audit/events", params={name: value},
                                     headers=auditor), 422, name)
    # Numbers pydantic would take for Unix timestamps, and words, are not times.
    for path in ("/api/audit/events", "/api/audit/access", "/api/audit/events/export"):
        for value in ("1.5e9", ".5", "-3589121", "yesterday"):
            response = await api.get(path, params={"until": value}, headers=auditor)
            assert response.status_code == 422, (path, value, response.text)
            assert "until" in response.text and "ISO 8601" in response.text
    fine = await api.get("/api/audit/events",
                         params={"until": "2026-12-01T00:00:00", "kind": "promotion",
                                 "action": "sign_audit"}, headers=auditor)
    assert fine.status_code == 200, fine.text


def test_cli_events_by_person_show_outcome_and_reason(
    app_cli: typer.Typer, people: dict[str, Person], owner_engine: Engine,
) -> None:
    person = make_user(owner_engine, "operator")
    _seed_day(owner_engine, person)
    shown = CliRunner().invoke(app_cli, ["audit", "events", "--person", person.name,
                                         "--token", people["auditor"].token])
    assert shown.exit_code == 0, shown.output
    assert "refused (409)" in shown.stdout and "not waiting for an approval" in shown.stdout
    assert "denied" in shown.stdout and "newer than the promotion" in shown.stdout
    bogus = CliRunner().invoke(app_cli, ["audit", "events", "--kind", "promotions",
                                         "--token", people["auditor"].token])
    assert bogus.exit_code == 2 and "promotions" in bogus.output


def test_verify_through_the_api_with_kept_anchors(
    app_cli: typer.Typer, people: dict[str, Person], web_settings: Settings,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, owner_engine: Engine,
) -> None:
    from triloop.cli import app

    kept = tmp_path / "anchors.txt"
    monkeypatch.setenv("TRILOOP_DATABASE_URL", web_settings.owner_url())
    monkeypatch.setenv("TRILOOP_SECRETS_DIR", str(web_settings.secrets))
    get_settings.cache_clear()
    try:
        make_user(owner_engine, "operator")  # at least one row to anchor
        anchored = CliRunner().invoke(app, ["audit", "anchor", "--file", str(kept)])
        assert anchored.exit_code == 0, anchored.output
    finally:
        get_settings.cache_clear()
    auditor = ["--token", people["auditor"].token]
    verified = CliRunner().invoke(app_cli, ["audit", "verify", "--anchor-file", str(kept),
                                            *auditor])
    assert verified.exit_code == 0, verified.output
    assert "audit chain verified" in verified.stdout
    assert "1 anchor(s) still held" in verified.stdout
    seq, _, signature = kept.read_text().split()
    kept.write_text(f"{seq} {'f' * 64} {signature}\n")  # edited to match a rewrite
    forged = CliRunner().invoke(app_cli, ["audit", "verify", "--anchor-file", str(kept),
                                          *auditor])
    assert forged.exit_code == 1 and "signature does not match" in forged.stderr
    plain = CliRunner().invoke(app_cli, ["audit", "verify", *auditor])
    assert plain.exit_code == 0 and "no gap, no edit" in plain.stdout
    refused = CliRunner().invoke(app_cli, ["audit", "verify", "--token",
                                           people["engineer"].token])
    assert refused.exit_code == 1 and "403" in refused.stderr


def test_audit_commands_outside_the_clone_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, web_settings: Settings,
) -> None:
    """No token, no database password: a sentence, never a raw psycopg.OperationalError."""
    from triloop.cli import _mount_plugins, app

    _mount_plugins()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRILOOP_HOME", str(tmp_path / ".triloop"))
    for name in ("TRILOOP_DATABASE_URL", "TRILOOP_DATABASE_URL_WEB", "TRILOOP_SECRETS_DIR",
                 "TRILOOP_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    # The test database is there, but this folder holds none of its passwords.
    monkeypatch.setenv("TRILOOP_PG_PORT", str(web_settings.pg_port))
    get_settings.cache_clear()
    try:
        verify = CliRunner().invoke(app, ["audit", "verify"])
        assert verify.exit_code == 2 and "no API token" in verify.output, verify.output
        anchor = CliRunner().invoke(app, ["audit", "anchor"])
        assert anchor.exit_code == 1, anchor.output
        assert "runs on the server" in anchor.output
        assert "OperationalError" not in anchor.output and "Traceback" not in anchor.output
    finally:
        get_settings.cache_clear()
