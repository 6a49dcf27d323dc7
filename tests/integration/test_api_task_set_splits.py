"""Runs and eval sets name task sets and splits; the web service resolves them to task ids.

A run trains on the train split of admitted sets (``rollout.task_sets``); the stored run
lists the ids and names each set by its id. An eval set is frozen from an admitted set's
eval split (``from_task_set``). Every other split, an unadmitted set or an unknown one is a
422 naming it, with nothing recorded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import Engine, text
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from governance_loop.worker import build_worker
from tests.factories import make_checkpoint, make_task
from tests.factories_task_sets import TaskSetRows, make_task_set
from tests.factories_web import Person, assert_problem
from triloop.config import Settings
from triloop.temporal import connect
from triloop.wiring import build_authorizer
from triloop.workflow_api import LEARNING_QUEUE, TRAINING_RUN_WORKFLOW, TrainingRunInput

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]

SPLITS = ["train", "eval", "train", "traffic", "eval", "train"]


@workflow.defn(name=TRAINING_RUN_WORKFLOW)
class StandInTrainingRun:
    """Accepts the run and ends: the learning loop is not what these tests are about."""

    @workflow.run
    async def run(self, run: TrainingRunInput) -> None:
        del run


@pytest_asyncio.fixture(loop_scope="session")
async def learning_stand_in(web_settings: Settings) -> AsyncIterator[Client]:
    """A stand-in training run workflow on the web tests' learning queue."""
    client = await connect(web_settings, identity="test-learning-stand-in", service="learning")
    async with Worker(client, task_queue=web_settings.task_queue(LEARNING_QUEUE),
                      workflows=[StandInTrainingRun],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        yield client


@pytest_asyncio.fixture(loop_scope="session")
async def governance(web_settings: Settings, role_engine: Any) -> AsyncIterator[Client]:
    """The real governance worker on the web tests' queues (it freezes eval sets)."""
    client = await connect(web_settings, identity="test-governance-worker", service="governance")
    async with build_worker(client, web_settings, engine=role_engine("governance"),
                            authorizer=build_authorizer(web_settings, "governance")):
        yield client


def _admitted_set(owner: Engine) -> TaskSetRows:
    return make_task_set(owner, splits=SPLITS, status="admitted", task_status="admitted")


def _run(task_sets: list[dict[str, str]], base: str, task_ids: list[str] | None = None
         ) -> dict[str, Any]:
    rollout: dict[str, Any] = {"task_sets": task_sets}
    if task_ids:
        rollout["task_ids"] = task_ids
    return {"config": {"name": "sets", "model": {"base": base}, "rollout": rollout}}


def _runs_named(owner: Engine, base: str) -> list[Any]:
    with owner.connect() as conn:
        return list(conn.execute(text("SELECT config FROM training_run"
                                      " WHERE base_checkpoint_id = :b"), {"b": base}).scalars())


async def test_a_run_trains_on_the_train_split_of_a_named_set(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    learning_stand_in: Client,
) -> None:
    task_set, other = _admitted_set(owner_engine), _admitted_set(owner_engine)
    single = make_task(owner_engine)
    base = make_checkpoint(owner_engine)
    body = _run([{"task_set": f"{task_set.name}@1"},
                 {"task_set": other.id[:10], "split": "train"}], base, [single])
    response = await api.post("/api/runs", json=body, headers=people["engineer"].headers)
    assert response.status_code == 201, response.text
    [config] = _runs_named(owner_engine, base)
    assert config["rollout"]["task_ids"] == [single, *task_set.split("train"),
                                             *other.split("train")]
    assert config["rollout"]["task_sets"] == [{"task_set": task_set.id, "split": "train"},
                                              {"task_set": other.id, "split": "train"}]


async def test_a_run_may_not_name_a_held_out_split_or_an_unadmitted_or_unknown_set(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    admitted = _admitted_set(owner_engine)
    pending = make_task_set(owner_engine, splits=SPLITS)
    base = make_checkpoint(owner_engine)
    headers = people["engineer"].headers
    for chosen, needles in [
        ({"task_set": admitted.id, "split": "eval"},
         ["rollout.task_sets[0]", admitted.name, "'eval' is held out for evaluation"]),
        ({"task_set": f"{admitted.name}@1", "split": "traffic"},
         [admitted.name, "held out for production traffic"]),
        ({"task_set": pending.name}, [pending.name, "is pending, not admitted"]),
        ({"task_set": "no-such-set"}, ["'no-such-set' names no registered task set"]),
        ({"task_set": f"{admitted.name}@7"}, ["no version 7"]),
    ]:
        response = await api.post("/api/runs", json=_run([chosen], base), headers=headers)
        assert_problem(response, 422, *needles)
    # A RUN.yaml naming no tasks at all is invalid on its own.
    assert_problem(await api.post("/api/runs", json=_run([], base), headers=headers), 422,
                   "rollout.task_sets", "no tasks to train on")
    assert _runs_named(owner_engine, base) == []


async def test_an_eval_set_is_frozen_from_an_eval_split_only(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, governance: Client,
) -> None:
    task_set = _admitted_set(owner_engine)
    headers = people["operator"].headers
    name = f"{task_set.name}-eval"
    frozen = await api.post("/api/eval-sets", json={
        "name": name, "from_task_set": f"{task_set.name}@1", "split": "eval",
        "comment": "held out"}, headers=headers)
    assert frozen.status_code == 201, frozen.text
    assert frozen.json()["task_ids"] == task_set.split("eval")
    with owner_engine.connect() as conn:
        details = conn.execute(text("SELECT details FROM human_decision WHERE id = :d"),
                               {"d": frozen.json()["decision_id"]}).scalar_one()
    assert details["task_set_id"] == task_set.id and details["split"] == "eval"
    refused: list[tuple[dict[str, Any], list[str]]] = [
        ({"from_task_set": task_set.id, "split": "train"},
         ["from_task_set", "split 'train' is for training", "takes split 'eval' only"]),
        ({"from_task_set": task_set.id, "split": "traffic"}, ["held out for production"]),
        ({"from_task_set": make_task_set(owner_engine, splits=SPLITS).id}, ["not admitted"]),
        ({"from_task_set": task_set.id, "task_ids": task_set.split("eval")}, ["exactly one"]),
        ({}, ["exactly one"]),
    ]
    for body, needles in refused:
        assert_problem(await api.post("/api/eval-sets", json={"name": uid_name(), **body},
                                      headers=headers), 422, *needles)
    # Now that the eval split is frozen, a run naming its tasks is refused as today.
    base = make_checkpoint(owner_engine)
    response = await api.post("/api/runs", json=_run([], base, task_set.split("eval")),
                              headers=people["engineer"].headers)
    assert_problem(response, 422, "holds out")


async def test_eval_set_create_freezes_an_eval_split_from_the_cli(
    monkeypatch: pytest.MonkeyPatch, web_app: Any, people: dict[str, Person],
    owner_engine: Engine, governance: Client,
) -> None:
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from governance_loop.cli import governance_app

    client = TestClient(web_app)

    def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
        kwargs.pop("timeout", None)
        return client.request(method, url.replace("http://127.0.0.1:8000", ""), **kwargs)

    monkeypatch.setattr(httpx, "request", request)
    task_set, name = _admitted_set(owner_engine), uid_name()

    def create(*args: str) -> Any:
        return CliRunner().invoke(governance_app, ["eval-set", "create", name, *args,
                                                   "--token", people["operator"].token])

    both = await asyncio.to_thread(create, "--task", task_set.task_ids[1], "--from-task-set",
                                   task_set.id)
    assert both.exit_code == 1 and "exactly one" in both.output
    train = await asyncio.to_thread(create, "--from-task-set", task_set.id, "--split", "train")
    assert train.exit_code == 1 and "422" in train.output and "split 'train'" in train.output
    made = await asyncio.to_thread(create, "--from-task-set", f"{task_set.name}@1")
    assert made.exit_code == 0 and f"{name} v1 " in made.output, made.output


def uid_name() -> str:
    """A fresh eval set name."""
    from tests.factories import uid

    return uid("es-")


async def test_an_unknown_task_set_has_no_admission(
    api: httpx.AsyncClient, people: dict[str, Person],
) -> None:
    assert_problem(await api.post("/api/task-sets/feedface00/admission",
                                  json={"decision": "reject", "comment": "gone"},
                                  headers=people["operator"].headers), 404, "feedface00")
