"""The demo's people under two-person grants: two founding admins, the second confirms."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.factories import uid
from triloop.config import Settings
from triloop.db import engine_for_url

pytestmark = pytest.mark.integration


def test_demo_people_on_a_fresh_stack_and_on_one_where_the_demo_ran(
    database_url: str, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scripts import demo_world
    from triloop.devstack.postgres import ensure_database
    from triloop.migrate import upgrade
    from web.app import create_app

    name = uid("demo_")
    owner = make_url(database_url)
    ensure_database(owner.set(drivername="postgresql", database="postgres")
                    .render_as_string(hide_password=False), name)
    fresh = owner.set(database=name).render_as_string(hide_password=False)
    upgrade(fresh)
    shutil.copytree(settings.secrets, tmp_path / "secrets")  # role passwords, OPA tokens
    demo = settings.model_copy(update={"database_url": fresh,
                                       "secrets_dir": tmp_path / "secrets"})
    client = TestClient(create_app(demo, temporal_timeout_s=15.0))

    def post(url: str, **kwargs: Any) -> httpx.Response:
        kwargs.pop("timeout", None)
        return client.post(url.replace("http://demo", ""), **kwargs)

    monkeypatch.setattr(httpx, "post", post)
    for run in ("first", "again"):  # a fresh stack, then the same stack a second time
        people = demo_world.create_people(demo, run, "http://demo")
        for role, person in people.items():
            me = client.get("/api/me", headers={"Authorization": f"Bearer {person.token}"})
            assert me.json()["roles"] == [role] == person.roles, (run, me.text)
            # Kept for signing in to the console after the demo, readable by its owner only.
            kept = tmp_path / "secrets" / demo_world.person_token_secret(role)
            assert kept.read_text() == person.token and kept.stat().st_mode & 0o077 == 0
    assert (tmp_path / "secrets" / "demo-admin-2-token").exists()
    with engine_for_url(fresh).connect() as conn:
        grants = conn.execute(text(
            "SELECT requested_by, confirmed_by, status FROM role_grant")).all()
        admins = conn.execute(text(
            "SELECT count(*) FROM app_user WHERE 'admin' = ANY(roles)")).scalar_one()
    assert len(grants) == 4 and admins == 2
    assert {tuple(g) for g in grants} == {("demo-admin", "demo-admin-2", "active")}
