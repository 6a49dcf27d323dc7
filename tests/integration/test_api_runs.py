"""Training runs through the API: submit (row + learning workflow), pause/resume/cancel signals.

The learning worker is not what these tests are about: a stand-in workflow,
registered under the real name on this test's learning queue, records what the
web service sent so the test can check it through a query.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import Engine, text
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.factories import insert, make_eval_set, make_run, make_task
from tests.factories_web import Person, assert_problem
from triloop import search_attributes
from triloop.config import Settings
from triloop.temporal import connect
from triloop.workflow_api import (
    LEARNING_QUEUE,
    RUN_CANCEL_SIGNAL,
    RUN_PAUSE_SIGNAL,
    RUN_RESUME_SIGNAL,
    RUN_STATUS_QUERY,
    TRAINING_RUN_WORKFLOW,
    RunControl,
    TrainingRunInput,
)

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


@workflow.defn(name=TRAINING_RUN_WORKFLOW)
class StandInTrainingRun:
    """Records its input and every control signal; ends on cancel."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.cancelled = False

    @workflow.run
    async def run(self, run: TrainingRunInput) -> None:
        self.seen.append(f"start {run.run_id} by {run.submitted_by} base "
                         f"{run.config.model.base}")
        await workflow.wait_condition(lambda: self.cancelled)

    @workflow.signal(name=RUN_PAUSE_SIGNAL)
    def pause(self, control: RunControl) -> None:
        self.seen.append(f"pause {control.decision_id}")

    @workflow.signal(name=RUN_RESUME_SIGNAL)
    def resume(self, control: RunControl) -> None:
        self.seen.append(f"resume {control.decision_id}")

    @workflow.signal(name=RUN_CANCEL_SIGNAL)
    def cancel(self, control: RunControl) -> None:
        self.seen.append(f"cancel {control.decision_id}")
        self.cancelled = True

    @workflow.query(name=RUN_STATUS_QUERY)
    def status(self) -> list[str]:
        return self.seen


@pytest_asyncio.fixture(loop_scope="session")
async def learning_stand_in(web_settings: Settings) -> AsyncIterator[Client]:
    client = await connect(web_settings, identity="test-learning-stand-in", service="learning")
    async with Worker(client, task_queue=web_settings.task_queue(LEARNING_QUEUE),
                      workflows=[StandInTrainingRun],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        yield client


def _config(task_id: str) -> dict[str, object]:
    return {"name": "web test run", "model": {"base": "/models/tiny-local"},
            "rollout": {"task_ids": [task_id], "group_size": 2}}


def _runs_of(engine: Engine, user: str) -> int:
    with engine.begin() as conn:
        return int(conn.execute(text("SELECT count(*) FROM training_run WHERE submitted_by=:u"),
                                {"u": user}).scalar_one())


async def test_submit_inserts_the_run_and_starts_the_learning_workflow(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    learning_stand_in: Client,
) -> None:
    engineer = people["engineer"]
    response = await api.post("/api/runs", json={"config": _config(make_task(owner_engine))},
                              headers=engineer.headers)
    assert response.status_code == 201, response.text
    run = response.json()
    assert run["submitted_by"] == engineer.name and run["status"] == "submitted"
    assert run["workflow_id"] == f"training-run-{run['id']}"
    assert len(run["environment_version_ids"]) == 1
    handle = learning_stand_in.get_workflow_handle(run["workflow_id"])
    # Findable in Temporal by the ids the console shows (triloop.search_attributes).
    found = (await handle.describe()).typed_search_attributes
    assert found.get(search_attributes.RUN_ID) == run["id"]
    assert found.get(search_attributes.USER) == engineer.name
    assert found.get(search_attributes.LOOP) == "learning"
    seen = await handle.query(RUN_STATUS_QUERY)
    assert seen == [f"start {run['id']} by {engineer.name} base /models/tiny-local"]
    with owner_engine.begin() as conn:
        row = conn.execute(text("SELECT submitted_by, config FROM training_run WHERE id=:i"),
                           {"i": run["id"]}).one()
    assert row[0] == engineer.name and row[1]["rollout"]["group_size"] == 2

    for action, reason in (("pause", "look at the alarm"), ("resume", ""), ("cancel", "")):
        control = await api.post(f"/api/runs/{run['id']}/{action}", json={"reason": reason},
                                 headers=engineer.headers)
        assert control.status_code == 202, control.text
    await handle.result()
    # Each signal carried only the id of the decision the web role recorded.
    sent = [entry.split() for entry in (await handle.query(RUN_STATUS_QUERY))[1:]]
    assert [action for action, _ in sent] == ["pause", "resume", "cancel"]
    with owner_engine.connect() as conn:
        recorded = [conn.execute(text(
            "SELECT kind, subject, decision, user_name, comment, recorded_by "
            "FROM human_decision WHERE id = :i"), {"i": decision_id}).one()
            for _, decision_id in sent]
    assert [tuple(r) for r in recorded] == [
        ("run_control", run["id"], "pause", engineer.name, "look at the alarm", "triloop_web"),
        ("run_control", run["id"], "resume", engineer.name, "", "triloop_web"),
        ("run_control", run["id"], "cancel", engineer.name, "", "triloop_web"),
    ]


async def test_submit_accepts_yaml_text(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    learning_stand_in: Client,
) -> None:
    task = make_task(owner_engine)
    yaml_text = (f"name: yaml run\nmodel:\n  base: /models/tiny-local\nrollout:\n"
                 f"  task_ids: [{task}]\n")
    response = await api.post("/api/runs", json={"config_yaml": yaml_text},
                              headers=people["engineer"].headers)
    assert response.status_code == 201, response.text
    handle = learning_stand_in.get_workflow_handle(response.json()["workflow_id"])
    await handle.signal(RUN_CANCEL_SIGNAL, RunControl("test"))
    await handle.result()


@pytest.mark.parametrize(("body", "needle"), [
    ({"config": {"name": "x", "model": {"base": "tiny"}}}, "rollout"),
    ({"config": {"name": "x", "model": {"base": "tiny"}, "rollout": {"task_ids": []}}},
     "task_ids"),
    ({"config_yaml": "name: [unclosed"}, "yaml"),
    ({"config_yaml": "- just\n- a list\n"}, "mapping"),
    ({"config": {"name": "x"}, "config_yaml": "name: x"}, "exactly one"),
    ({}, "exactly one"),
    ({"config": "not an object"}, "config"),
])
async def test_invalid_configs_are_422_and_write_nothing(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    body: dict[str, object], needle: str,
) -> None:
    engineer = people["engineer2"]
    before = _runs_of(owner_engine, engineer.name)
    response = await api.post("/api/runs", json=body, headers=engineer.headers)
    assert_problem(response, 422, needle)
    assert _runs_of(owner_engine, engineer.name) == before


async def test_tasks_must_exist_and_be_admitted(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    pending = make_task(owner_engine, status="pending")
    config = _config(pending)
    config["rollout"] = {"task_ids": [pending, "no-such-task"]}
    response = await api.post("/api/runs", json={"config": config},
                              headers=people["engineer2"].headers)
    assert_problem(response, 422, "no-such-task: no such task", f"{pending}: task is pending")


async def test_only_ml_engineers_submit(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    before = _runs_of(owner_engine, people["operator"].name)
    response = await api.post("/api/runs", json={"config": _config(make_task(owner_engine))},
                              headers=people["operator"].headers)
    assert_problem(response, 403, "submit")
    assert _runs_of(owner_engine, people["operator"].name) == before


async def test_people_control_only_their_own_runs(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    run_id = make_run(owner_engine, submitted_by=people["engineer"].name)
    response = await api.post(f"/api/runs/{run_id}/pause", headers=people["engineer2"].headers)
    assert_problem(response, 403, "only their own runs")
    response = await api.post(f"/api/runs/{run_id}/cancel", headers=people["operator"].headers)
    assert_problem(response, 403)


async def test_controls_refuse_by_state_before_temporal(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    engineer = people["engineer"]
    assert_problem(await api.post("/api/runs/nope/pause", headers=engineer.headers), 404)
    no_workflow = make_run(owner_engine, submitted_by=engineer.name)
    assert_problem(await api.post(f"/api/runs/{no_workflow}/pause", headers=engineer.headers),
                   409, "no workflow")
    done = make_run(owner_engine, submitted_by=engineer.name)
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE training_run SET status='completed', workflow_id=:w "
                          "WHERE id=:i"), {"i": done, "w": f"training-run-{done}"})
    assert_problem(await api.post(f"/api/runs/{done}/resume", headers=engineer.headers),
                   409, "completed")
    assert_problem(await api.post(f"/api/runs/{done}/pause", json={"reason": "x" * 3000},
                                  headers=engineer.headers), 422)


async def test_signal_to_a_workflow_that_is_not_running_is_409(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    engineer = people["engineer"]
    run_id = make_run(owner_engine, submitted_by=engineer.name)
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE training_run SET workflow_id=:w WHERE id=:i"),
                     {"i": run_id, "w": f"gone-{uuid.uuid4().hex}"})
    response = await api.post(f"/api/runs/{run_id}/pause", headers=engineer.headers)
    assert_problem(response, 409, "not running")


async def test_a_run_may_not_train_on_what_an_eval_set_holds_out(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    held_out = make_task(owner_engine)
    eval_set = make_eval_set(owner_engine)
    insert(owner_engine, "eval_item", eval_set_id=eval_set, ordinal=0, task_id=held_out)
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE eval_set SET frozen_at = now(), content_hash = 'h' "
                          "WHERE id = :s"), {"s": eval_set})
    before = _runs_of(owner_engine, people["engineer"].name)
    response = await api.post("/api/runs", json={"config": _config(held_out)},
                              headers=people["engineer"].headers)
    problem = assert_problem(response, 422, "eval set holds out")
    assert f"training task {held_out} is the same task" in str(problem)
    assert _runs_of(owner_engine, people["engineer"].name) == before  # nothing stored
