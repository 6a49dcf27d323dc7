"""Serving faults are an operator's act: through the API, authorized by OPA, audited."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import typer
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from tests.factories import make_checkpoint
from tests.factories_web import Person, assert_problem
from triloop.faults import faults_file, read_serving_faults
from web import cli

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's stack home: the faults file no other test's workers read."""
    return tmp_path_factory.mktemp("faults-home")


@pytest_asyncio.fixture(loop_scope="session")
async def api(faults_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=faults_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


def _events(engine: Engine, checkpoint: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT action, decision, actor->>'user' FROM audit_event "
            "WHERE resource->>'kind' = 'serving_fault' AND resource->>'id' = :c ORDER BY seq"),
            {"c": checkpoint}).all()]


async def test_only_an_operator_injects_a_fault_and_every_try_is_audited(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person], home: Path
) -> None:
    checkpoint = make_checkpoint(owner_engine)
    body = {"checkpoint_id": checkpoint, "temperature": 8, "note": "game day"}
    for who in ("engineer", "auditor", "admin"):
        refused = await api.post("/api/faults", headers=people[who].headers, json=body)
        assert_problem(refused, 403, "no rule lets user", "inject_fault serving_fault")
    assert read_serving_faults(home) == {}
    assert [e[:2] for e in _events(owner_engine, checkpoint)] == [("inject_fault", "deny")] * 3

    operator = people["operator"]
    injected = await api.post("/api/faults", headers=operator.headers, json=body)
    assert injected.status_code == 201, injected.text
    assert read_serving_faults(home)[checkpoint].temperature == 8.0
    # The decision, the fault's own record, then the outcome of the allowed action.
    assert _events(owner_engine, checkpoint)[-3:] == [
        ("inject_fault", "allow", operator.name), ("inject_fault", "record", operator.name),
        ("inject_fault", "record", operator.name)]
    listed = await api.get("/api/faults", headers=people["auditor"].headers)
    assert [f["checkpoint_id"] for f in listed.json()] == [checkpoint]

    assert_problem(await api.delete("/api/faults", headers=people["auditor"].headers), 403)
    assert checkpoint in read_serving_faults(home)
    cleared = await api.delete("/api/faults", headers=operator.headers)
    assert cleared.status_code == 200 and cleared.json() == {"cleared": 1}
    assert not faults_file(home).exists()


async def test_fault_requests_are_validated(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person], home: Path
) -> None:
    operator = people["operator"].headers
    unknown = await api.post("/api/faults", headers=operator,
                             json={"checkpoint_id": "no-such-checkpoint", "temperature": 2})
    assert_problem(unknown, 404, "no-such-checkpoint")
    checkpoint = make_checkpoint(owner_engine)
    for temperature in (0, -1, 1e9):
        bad = await api.post("/api/faults", headers=operator,
                             json={"checkpoint_id": checkpoint, "temperature": temperature})
        assert_problem(bad, 422)
    assert read_serving_faults(home) == {}


def test_the_cli_acts_through_the_api_with_the_operators_token(
    faults_app: FastAPI, people: dict[str, Person], owner_engine: Engine, home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = TestClient(faults_app)

    def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
        kwargs.pop("timeout", None)
        return client.request(method, url.replace("http://127.0.0.1:8000", ""), **kwargs)

    monkeypatch.setattr(httpx, "request", request)
    monkeypatch.delenv("TRILOOP_TOKEN", raising=False)
    root = typer.Typer()
    root.add_typer(cli.faults_app, name="faults")
    checkpoint = make_checkpoint(owner_engine)
    anonymous = CliRunner().invoke(root, ["faults", "inject", checkpoint])
    assert anonymous.exit_code == 2 and "no API token" in anonymous.output
    auditor = CliRunner().invoke(root, ["faults", "inject", checkpoint, "--token",
                                        people["auditor"].token])
    assert auditor.exit_code == 1 and "403" in auditor.output
    assert read_serving_faults(home) == {}
    monkeypatch.setenv("TRILOOP_TOKEN", people["operator"].token)
    done = CliRunner().invoke(root, ["faults", "inject", checkpoint[:14],  # a unique prefix
                                     "--temperature", "6"])
    assert done.exit_code == 0, done.output
    assert f"serving {checkpoint} at temperature 6.0" in done.output
    assert read_serving_faults(home)[checkpoint].temperature == 6.0
    listed = CliRunner().invoke(root, ["faults", "list"])  # piped: tab-separated lines
    assert listed.exit_code == 0, listed.output
    header, *rows = (line.split("\t") for line in listed.output.splitlines())
    assert header[:4] == ["checkpoint", "temperature", "by", "since"], header
    row = next(r for r in rows if r[0] == checkpoint)
    assert row[1] == "6.0" and row[2] == people["operator"].name and row[3]  # who and since
    cleared = CliRunner().invoke(root, ["faults", "clear"])
    assert cleared.exit_code == 0 and "cleared 1" in cleared.output
