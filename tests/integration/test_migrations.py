"""Migrations upgrade a fresh database to head and downgrade it back to base."""

from __future__ import annotations

import psycopg
import pytest

from tests.factories import uid
from triloop.devstack.postgres import ensure_database
from triloop.migrate import downgrade, upgrade

pytestmark = pytest.mark.integration


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
    return {row[0] for row in rows}


def test_upgrade_then_downgrade_to_base(database_url: str) -> None:
    name = uid("mig_")
    admin = database_url.replace("+psycopg", "").rsplit("/", 1)[0] + "/postgres"
    ensure_database(admin, name)
    url = database_url.rsplit("/", 1)[0] + f"/{name}"
    plain = url.replace("+psycopg", "")

    upgrade(url)
    tables = _tables(plain)
    assert {"audit_event", "checkpoint", "eval_set", "promotion", "routing", "step"} <= tables
    with psycopg.connect(plain) as conn:
        triggers = {r[0] for r in conn.execute("SELECT tgname FROM pg_trigger").fetchall()}
    assert "audit_event_no_update_delete" in triggers

    downgrade(url, "base")
    assert _tables(plain) <= {"alembic_version"}

    upgrade(url)  # and back up again: the migrations are re-runnable
    assert "audit_event" in _tables(plain)


def test_0003_moves_existing_tokens_and_back(database_url: str) -> None:
    name = uid("mig_")
    admin = database_url.replace("+psycopg", "").rsplit("/", 1)[0] + "/postgres"
    ensure_database(admin, name)
    url = database_url.rsplit("/", 1)[0] + f"/{name}"
    plain = url.replace("+psycopg", "")
    upgrade(url, "0002")
    with psycopg.connect(plain) as conn:
        conn.execute("INSERT INTO app_user (name, roles, token_hash, created_by, disabled) "
                     "VALUES ('ann', '{operator}', 'hash-of-ann', 'test', false)")
    upgrade(url, "0003")
    with psycopg.connect(plain) as conn:
        token = conn.execute("SELECT user_name, token_hash, expires_at > now(), revoked_at "
                             "FROM api_token").fetchall()
        columns = {r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'app_user'")}
    assert token == [("ann", "hash-of-ann", True, None)]  # it keeps working, until it expires
    assert "token_hash" not in columns
    downgrade(url, "0002")
    with psycopg.connect(plain) as conn:
        assert conn.execute("SELECT token_hash FROM app_user WHERE name = 'ann'").fetchone() == (
            "hash-of-ann",)


def test_0019_stores_each_alarm_as_one_object_and_back(database_url: str) -> None:
    name = uid("mig_")
    admin = database_url.replace("+psycopg", "").rsplit("/", 1)[0] + "/postgres"
    ensure_database(admin, name)
    url = database_url.rsplit("/", 1)[0] + f"/{name}"
    plain = url.replace("+psycopg", "")
    upgrade(url, "0016")
    with psycopg.connect(plain) as conn:
        conn.execute("INSERT INTO training_run (id, name, submitted_by, status, iterations_done)"
                     " VALUES ('r', 'r', 'ann', 'running', 2)")
        conn.execute("INSERT INTO training_step (run_id, iteration, alarms, length_stats, metrics)"
                      " VALUES ('r', 2, '{echo_trap,template_collapse}', '{}',"
                      " '{\"alarm_messages\": [\"echo\", \"collapse\"], \"series\": {}}')")
    upgrade(url, "0019")
    with psycopg.connect(plain) as conn:
        (metrics,) = conn.execute("SELECT metrics FROM training_step").fetchone() or (None,)
    assert metrics == {"series": {}, "alarms": [
        {"kind": "echo_trap", "iteration": 2, "message": "echo", "evidence": {}},
        {"kind": "template_collapse", "iteration": 2, "message": "collapse", "evidence": {}}]}
    downgrade(url, "0016")
    with psycopg.connect(plain) as conn:
        (metrics,) = conn.execute("SELECT metrics FROM training_step").fetchone() or (None,)
    assert metrics == {"series": {}, "alarm_messages": ["echo", "collapse"]}
