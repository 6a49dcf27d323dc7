"""A run's placebo through the API and the CLI: the run's own config with the task reward
zeroed, the same seed, submitted by the same checks as any run (its owner only).

The learning workflow is the stand-in of ``test_api_runs``: it records what the web service
started, and ends when cancelled.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import typer
from sqlalchemy import Engine, text
from temporalio.client import Client
from typer.testing import CliRunner

from tests.factories import insert, make_task, uid
from tests.factories_web import Person, assert_problem
from tests.integration.test_api_runs import learning_stand_in  # noqa: F401 (fixture)
from triloop.workflow_api import RUN_CANCEL_SIGNAL, RUN_STATUS_QUERY, RunControl

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures", "tests.integration.cli_app"]


def _run(engine: Engine, owner: str, config: dict[str, Any] | None = None) -> str:
    """A completed run of ``owner`` whose stored config trains on an admitted task."""
    run_id = uid("run-")
    insert(engine, "training_run", id=run_id, submitted_by=owner, status="completed",
           iterations_done=4, name="lake run", config=config or {
               "name": "lake run", "model": {"base": "/models/tiny-local"},
               "rollout": {"task_ids": [make_task(engine)], "group_size": 2},
               "schedule": {"iterations": 4, "propose_every": 2, "seed": 11}})
    return run_id


def _runs_of(engine: Engine, user: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM training_run WHERE submitted_by=:u"),
                                {"u": user}).scalar_one())


def _stored(engine: Engine, run_id: str) -> tuple[str, dict[str, Any]]:
    with engine.connect() as conn:
        row = conn.execute(text("SELECT name, config FROM training_run WHERE id = :i"),
                           {"i": run_id}).one()
    return str(row[0]), dict(row[1])


async def _cancel(client: Client, workflow_id: str) -> list[str]:
    handle = client.get_workflow_handle(workflow_id)
    seen: list[str] = await handle.query(RUN_STATUS_QUERY)
    await handle.signal(RUN_CANCEL_SIGNAL, RunControl("test"))
    await handle.result()
    return seen


async def test_the_placebo_is_the_runs_config_with_the_task_reward_zeroed(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    learning_stand_in: Client,  # noqa: F811
) -> None:
    engineer = people["engineer"]
    run_id = _run(owner_engine, engineer.name)
    response = await api.post(f"/api/runs/{run_id}/placebo", headers=engineer.headers)
    assert response.status_code == 201, response.text
    placebo = response.json()
    assert placebo["name"] == "lake run (placebo)" and placebo["submitted_by"] == engineer.name
    seen = await _cancel(learning_stand_in, placebo["workflow_id"])
    assert seen == [f"start {placebo['id']} by {engineer.name} base /models/tiny-local"]
    name, config = _stored(owner_engine, placebo["id"])
    _, original = _stored(owner_engine, run_id)
    assert name == "lake run (placebo)" and config["advantage"]["zero_task_reward"] is True
    assert config["schedule"]["seed"] == 11
    assert config["rollout"]["task_ids"] == original["rollout"]["task_ids"]

    # A placebo controls for a run; it has no placebo of its own.
    again = await api.post(f"/api/runs/{placebo['id']}/placebo", headers=engineer.headers)
    assert_problem(again, 409, "is itself a placebo")


async def test_only_the_runs_owner_submits_its_placebo(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    run_id = _run(owner_engine, people["engineer"].name)
    for who, needle in (("engineer2", "only their own runs"), ("operator", "submit")):
        before = _runs_of(owner_engine, people[who].name)
        refused = await api.post(f"/api/runs/{run_id}/placebo", headers=people[who].headers)
        assert_problem(refused, 403, needle)
        assert _runs_of(owner_engine, people[who].name) == before
    assert_problem(await api.post("/api/runs/no-such-run/placebo",
                                  headers=people["engineer"].headers), 404, "no-such-run")


async def test_a_stored_config_that_no_longer_validates_is_422(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    engineer = people["engineer2"]
    run_id = _run(owner_engine, engineer.name, {"name": "old", "model": {"base": "tiny"}})
    before = _runs_of(owner_engine, engineer.name)
    refused = await api.post(f"/api/runs/{run_id}/placebo", headers=engineer.headers)
    assert_problem(refused, 422, "rollout")
    assert _runs_of(owner_engine, engineer.name) == before


async def test_train_placebo_submits_through_the_api_for_the_signed_in_person(
    app_cli: typer.Typer, people: dict[str, Person], owner_engine: Engine,
    learning_stand_in: Client,  # noqa: F811
) -> None:
    engineer = people["engineer"]
    run_id = _run(owner_engine, engineer.name)
    refused = CliRunner().invoke(app_cli, ["train", "placebo", run_id,
                                           "--token", people["engineer2"].token])
    assert refused.exit_code == 1 and "403" in refused.output, refused.output
    made = CliRunner().invoke(app_cli, ["train", "placebo", run_id, "--output", "json",
                                        "--token", engineer.token])
    assert made.exit_code == 0, made.output
    placebo = json.loads(made.output)
    assert placebo["name"] == "lake run (placebo)"
    await _cancel(learning_stand_in, placebo["workflow_id"])
