"""Fixture: the API-facing CLI groups, talking to the test app in-process."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import typer
from fastapi import FastAPI
from fastapi.testclient import TestClient

from triloop.config import Settings
from web import cli
from web.cli_audit import audit_app
from web.cli_checkpoints import checkpoints_app
from web.cli_deployments import deployments_app, rollback_command
from web.cli_promotions import promotions_app
from web.cli_trajectories import trajectories_app


@pytest.fixture
def app_cli(
    monkeypatch: pytest.MonkeyPatch, web_settings: Settings, web_app: FastAPI
) -> typer.Typer:
    """The CLI groups mounted as in triloop, talking to the test database and app."""
    monkeypatch.setattr(cli, "get_settings", lambda: web_settings)
    client = TestClient(web_app)

    def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
        kwargs.pop("timeout", None)
        return client.request(method, url.replace("http://127.0.0.1:8000", ""), **kwargs)

    monkeypatch.setattr(httpx, "request", request)
    root = typer.Typer()
    root.add_typer(cli.users_app, name="users")
    root.add_typer(cli.train_app, name="train")
    root.add_typer(promotions_app, name="promotions")
    root.add_typer(deployments_app, name="deployments")
    root.add_typer(checkpoints_app, name="checkpoints")
    root.add_typer(cli.faults_app, name="faults")
    root.add_typer(audit_app, name="audit")
    root.add_typer(trajectories_app, name="trajectories")
    root.command("rollback")(rollback_command)
    return root
