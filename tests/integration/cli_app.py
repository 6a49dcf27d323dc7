"""Fixtures: the API-facing CLI groups, talking to the test app in-process (``app_cli``), or
run in a thread with their requests answered on the session's loop (``invoke_cli``), where
the stand-in workflows' workers poll too."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio
import typer
from click.testing import Result
from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from governance_loop.cli import governance_app
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
    root.add_typer(governance_app, name="governance")
    root.command("rollback")(rollback_command)
    return root


InvokeCli = Callable[..., Awaitable[Result]]


def mounted_cli() -> typer.Typer:
    """Every API-facing group, mounted as in triloop."""
    root = typer.Typer()
    for name, group in (("users", cli.users_app), ("train", cli.train_app),
                        ("promotions", promotions_app), ("deployments", deployments_app),
                        ("checkpoints", checkpoints_app), ("faults", cli.faults_app),
                        ("audit", audit_app), ("trajectories", trajectories_app)):
        root.add_typer(group, name=name)
    root.add_typer(governance_app, name="governance")
    root.command("rollback")(rollback_command)
    return root


@pytest_asyncio.fixture(loop_scope="session")
async def invoke_cli(api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> InvokeCli:
    """``await invoke_cli(*args, token=...)``: a CLI command run in a thread, its HTTP calls
    answered by ``api`` on this (the session's) loop."""
    loop = asyncio.get_running_loop()

    def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
        kwargs.pop("timeout", None)
        call = api.request(method, url.replace("http://127.0.0.1:8000", ""), **kwargs)
        return asyncio.run_coroutine_threadsafe(call, loop).result(timeout=120)

    monkeypatch.setattr(httpx, "request", request)
    monkeypatch.delenv("TRILOOP_TOKEN", raising=False)
    root = mounted_cli()

    async def run(*args: str, token: str) -> Result:
        return await asyncio.to_thread(CliRunner().invoke, root, [*args, "--token", token])

    return run
