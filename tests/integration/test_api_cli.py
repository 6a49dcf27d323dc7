"""The web CLI groups: ``users create`` makes the first admin only; the rest call the API."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError
from typer.testing import CliRunner

from tests.factories import make_checkpoint, make_run, uid
from tests.factories_web import (
    Person,
    add_approval,
    make_deployment,
    make_promotion,
    make_user,
)
from triloop.config import Settings

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures", "tests.integration.cli_app"]


def test_users_add_through_the_api_prints_a_token_that_signs_in(
    app_cli: typer.Typer, web_app: FastAPI, people: dict[str, Person]
) -> None:
    admin = people["admin"].token
    name = uid("erin").lower()
    result = CliRunner().invoke(app_cli, ["users", "add", name, "--role", "auditor",
                                          "--role", "operator", "--token", admin])
    assert result.exit_code == 0, result.output
    token = result.output.strip().splitlines()[-1]
    me = TestClient(web_app).get("/api/me", headers={"Authorization": f"Bearer {token}"})
    assert me.json()["roles"] == []  # both privileged: pending until a second admin confirms
    assert result.output.count("pending: another admin runs `triloop users confirm") == 2
    listed = CliRunner().invoke(app_cli, ["users", "list"])
    assert name in listed.output and token not in listed.output
    again = CliRunner().invoke(app_cli, ["users", "add", name, "--role", "auditor",
                                         "--token", admin])
    assert again.exit_code == 1 and "already exists" in again.output
    not_admin = CliRunner().invoke(app_cli, ["users", "add", uid("f").lower(), "--role",
                                             "auditor", "--token", people["operator"].token])
    assert not_admin.exit_code == 1 and "403" in not_admin.output


def test_users_create_makes_only_the_first_admin(
    app_cli: typer.Typer, database_url: str, web_settings: Settings, owner_engine: Engine
) -> None:
    # The session database has two admins: the server-side command refuses.
    make_user(owner_engine, "admin")
    make_user(owner_engine, "admin")
    refused = CliRunner().invoke(app_cli, ["users", "create", uid("root").lower(),
                                           "--role", "admin"])
    assert refused.exit_code == 1 and "admins already exist" in refused.output
    wrong_role = CliRunner().invoke(app_cli, ["users", "create", "root", "--role", "operator"])
    assert wrong_role.exit_code == 1 and "founding user is an admin" in wrong_role.output
    # On an empty database, as the owner on the server: two founding admins, then no third.
    # The web role may never write an admin (issue 32, route 4).
    from sqlalchemy.engine import make_url

    from triloop.db import engine_for_url, session_scope
    from triloop.devstack.postgres import ensure_database
    from triloop.migrate import upgrade
    from web.users import UserError, create_first_admin

    name = uid("fresh_")
    owner = make_url(database_url)
    ensure_database(owner.set(drivername="postgresql", database="postgres")
                    .render_as_string(hide_password=False), name)
    upgrade(owner.set(database=name).render_as_string(hide_password=False))
    web = engine_for_url(make_url(web_settings.role_url("web")).set(database=name)
                         .render_as_string(hide_password=False))
    server = engine_for_url(owner.set(database=name).render_as_string(hide_password=False))
    lifetime = web_settings.api_token_lifetime_s
    with pytest.raises(DBAPIError, match="only through a confirmed role grant"), \
            session_scope(web) as session:
        create_first_admin(session=session, name="root", created_by="test",
                           token_lifetime_s=lifetime)
    with session_scope(server) as session:
        user, token = create_first_admin(session=session, name="root", created_by="test",
                                         token_lifetime_s=lifetime)
    assert user.roles == ["admin"] and token
    with session_scope(server) as session:
        second, _ = create_first_admin(session=session, name="root2", created_by="test",
                                       token_lifetime_s=lifetime)
    assert second.roles == ["admin"]
    with pytest.raises(UserError, match="2 admins already exist"), \
            session_scope(server) as session:
        create_first_admin(session=session, name="root3", created_by="test",
                           token_lifetime_s=lifetime)


def test_users_grant_confirm_and_grants_commands_call_the_api(
    app_cli: typer.Typer, people: dict[str, Person], owner_engine: Engine
) -> None:
    first, second = people["admin"], make_user(owner_engine, "admin")
    person = make_user(owner_engine, "ml_engineer")
    asked = CliRunner().invoke(app_cli, ["users", "grant", person.name, "--role", "auditor",
                                         "--token", first.token])
    assert asked.exit_code == 0, asked.output
    grant_id = asked.output.split()[0]
    listed = CliRunner().invoke(app_cli, ["users", "grants", "--token", second.token])
    assert grant_id in listed.output and "pending" in listed.output
    own = CliRunner().invoke(app_cli, ["users", "confirm", grant_id, "--token", first.token])
    assert own.exit_code == 1 and "403" in own.output and "two-person rule" in own.output
    confirmed = CliRunner().invoke(app_cli, ["users", "confirm", grant_id,
                                             "--token", second.token])
    assert confirmed.exit_code == 0 and "active" in confirmed.output, confirmed.output


def test_train_and_promotions_commands_call_the_api(
    app_cli: typer.Typer, people: dict[str, Person], owner_engine: Engine, tmp_path: Path
) -> None:
    engineer = people["engineer"]
    run_id = make_run(owner_engine, submitted_by=engineer.name)
    status = CliRunner().invoke(app_cli, ["train", "status", run_id, "--token", engineer.token])
    assert status.exit_code == 0, status.output
    assert f"run {run_id}" in status.output and "submitted" in status.output

    bad_run = tmp_path / "RUN.yaml"
    bad_run.write_text("name: x\nmodel: {base: tiny}\n")
    submit = CliRunner().invoke(app_cli, ["train", "submit", str(bad_run), "--token",
                                          engineer.token])
    assert submit.exit_code == 1 and "422" in submit.output and "rollout" in submit.output

    seeded = make_promotion(owner_engine, submitted_by=engineer.name)
    add_approval(owner_engine, seeded.promotion_id, "audit", people["auditor"].name)
    shown = CliRunner().invoke(app_cli, ["promotions", "show", seeded.promotion_id,
                                         "--token", people["auditor"].token])
    assert shown.exit_code == 0 and "signed the audit" in shown.output
    listed = CliRunner().invoke(app_cli, ["promotions", "list", "--status", "open",
                                          "--token", people["operator"].token])
    assert listed.exit_code == 0 and seeded.promotion_id[:8] in listed.output


def test_rollback_needs_a_token_and_the_operator_role(
    app_cli: typer.Typer, people: dict[str, Person], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRILOOP_TOKEN", raising=False)
    missing = CliRunner().invoke(app_cli, ["rollback", "--reason", "x"])
    assert missing.exit_code == 2 and "no API token" in missing.output
    denied = CliRunner().invoke(app_cli, ["rollback", "--reason", "x", "--token",
                                          people["auditor"].token])
    assert denied.exit_code == 1 and ("403" in denied.output or "404" in denied.output)


def test_train_pause_resume_cancel_ask_the_api_for_the_signed_in_person(
    app_cli: typer.Typer, people: dict[str, Person], owner_engine: Engine
) -> None:
    run_id = make_run(owner_engine, submitted_by=people["engineer"].name)
    for action in ("pause", "resume", "cancel"):
        # The auditor does not own the run: the API refuses, and the CLI says so.
        refused = CliRunner().invoke(app_cli, ["train", action, run_id, "--reason", "x",
                                               "--token", people["auditor"].token])
        assert refused.exit_code == 1, refused.output
        assert "403" in refused.output, refused.output


def test_rollback_dry_run_shows_the_target_and_changes_nothing(
    app_cli: typer.Typer, people: dict[str, Person], owner_engine: Engine
) -> None:
    alias = uid("cli-").lower()
    current, target = make_checkpoint(owner_engine), make_checkpoint(owner_engine)
    make_deployment(owner_engine, alias, current, target)
    token = people["operator"].token
    shown = CliRunner().invoke(app_cli, ["rollback", "--dry-run", "--alias", alias,
                                         "--token", token])
    assert shown.exit_code == 0, shown.output
    assert "dry run: nothing changed" in shown.output
    assert f"revision 1: checkpoint {target}" in shown.output and "gov-admin" in shown.output
    named = CliRunner().invoke(app_cli, ["rollback", "--dry-run", "--alias", alias,
                                         "--to-revision", "2", "--token", token])
    assert named.exit_code == 1 and "which serves" in named.output
    no_reason = CliRunner().invoke(app_cli, ["rollback", "--alias", alias, "--token", token])
    assert no_reason.exit_code == 2 and "needs --reason" in no_reason.output
    with owner_engine.connect() as conn:
        still = conn.execute(text("SELECT checkpoint_id FROM deployment WHERE alias = :a"),
                             {"a": alias}).scalar_one()
    assert still == current


def test_users_token_commands_issue_list_and_revoke(
    app_cli: typer.Typer, web_app: FastAPI, people: dict[str, Person]
) -> None:
    person = people["auditor"]
    issued = CliRunner().invoke(app_cli, ["users", "token", person.name, "--label", "renewed"])
    assert issued.exit_code == 0, issued.output
    token_id = issued.output.split()[1]
    token = issued.output.strip().splitlines()[-1]
    client = TestClient(web_app)
    assert client.get("/api/me", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    listed = CliRunner().invoke(app_cli, ["users", "tokens", person.name])
    line = next(row for row in listed.output.splitlines() if row.startswith(token_id))
    assert line.split()[1] == "active" and "renewed" in line and token not in listed.output
    revoked = CliRunner().invoke(app_cli, ["users", "revoke-token", token_id])
    assert revoked.exit_code == 0 and "revoked" in revoked.output
    refused = client.get("/api/me", headers={"Authorization": f"Bearer {token}"})
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
    twice = CliRunner().invoke(app_cli, ["users", "revoke-token", token_id])
    assert twice.exit_code == 1 and "already revoked" in twice.output
    nobody = CliRunner().invoke(app_cli, ["users", "token", "nobody-" + person.name])
    assert nobody.exit_code == 1 and "no enabled user" in nobody.output
