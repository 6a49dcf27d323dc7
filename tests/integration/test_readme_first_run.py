"""The README's first run, as written: an admitted task set named as the example names it,
then `triloop train submit examples/tiny-frozen-lake.run.yaml` starts a run on its train
split (full task ids stored), and `governance task list` says which tasks are for training
and which are held out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from sqlalchemy import Engine, text
from temporalio.client import Client

from tests.factories import insert, uid
from tests.factories_task_sets import make_task_set
from tests.factories_web import Person
from tests.integration.console_client import console_session
from tests.integration.test_api_runs import learning_stand_in  # noqa: F401 (fixture)
from triloop.run_config import load_run_config
from triloop.workflow_api import RUN_CANCEL_SIGNAL, RunControl

if TYPE_CHECKING:  # the module is a pytest plugin here, imported by pytest first
    from tests.integration.cli_app import InvokeCli

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures", "tests.integration.cli_app"]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-frozen-lake.run.yaml"


async def test_the_readmes_example_run_is_submitted_as_written(
    invoke_cli: InvokeCli, people: dict[str, Person], owner_engine: Engine,
    learning_stand_in: Client,  # noqa: F811 (the imported fixture)
) -> None:
    [selection] = load_run_config(EXAMPLE.read_text()).rollout.task_sets
    # What the README's task-set register and admit leave: the set, admitted with its tasks.
    lake = make_task_set(owner_engine, splits=("train", "train", "train", "eval"),
                         status="admitted", task_status="admitted", name=selection.task_set)
    engineer = people["engineer"]
    submitted = await invoke_cli("train", "submit", str(EXAMPLE), "-o", "json",
                                 token=engineer.token)
    assert submitted.exit_code == 0, submitted.output
    run = json.loads(submitted.stdout)
    with owner_engine.connect() as conn:
        stored = conn.execute(text("SELECT config FROM training_run WHERE id = :i"),
                              {"i": run["id"]}).scalar_one()
    assert stored["rollout"]["task_ids"] == lake.split("train")  # full ids, in set order
    handle = learning_stand_in.get_workflow_handle(run["workflow_id"])
    await handle.signal(RUN_CANCEL_SIGNAL, RunControl("test"))
    await handle.result()


async def test_the_task_list_says_which_tasks_train_and_which_are_held_out(
    invoke_cli: InvokeCli, people: dict[str, Person], owner_engine: Engine,
    api: httpx.AsyncClient,
) -> None:
    tasks = make_task_set(owner_engine, splits=("train", "eval", "traffic"),
                          status="admitted", task_status="admitted")
    frozen = uid("frozen-")
    insert(owner_engine, "eval_set", id=frozen, name=frozen, version=1, created_by="gov")
    insert(owner_engine, "eval_item", eval_set_id=frozen, ordinal=0,
           task_id=tasks.split("eval")[0])
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE eval_set SET frozen_at = now(), content_hash = 'h'"
                          " WHERE id = :i"), {"i": frozen})
    with owner_engine.connect() as conn:
        environment = conn.execute(text(
            "SELECT environment_name FROM environment_version WHERE id = :v"),
            {"v": tasks.environment_version_id}).scalar_one()
    listed = await invoke_cli("governance", "task", "list", "--environment", environment,
                              token=people["engineer"].token)
    assert listed.exit_code == 0, listed.output
    header, *rows = listed.stdout.splitlines()
    assert header.split("\t")[:5] == ["id", "environment", "seed", "status", "use"]
    use = {row.split("\t")[0]: row.split("\t")[4] for row in rows}
    train, held, traffic = tasks.task_ids
    assert use == {
        train: "training",
        held: f"held out (eval set {frozen}@v1)",
        traffic: f"held out (traffic split of {tasks.name}@1)",
    }

    # The console's environment page shows the same: full ids (RUN.yaml takes them), and
    # which tasks are for training and which are held out.
    await console_session(api, people["engineer"])
    try:
        page = await api.get(f"/environments/{environment}")
    finally:
        api.cookies.clear()
    assert page.status_code == 200, page.text
    for task_id in tasks.task_ids:
        assert f'<code class="task-id" data-task-id="{task_id}">{task_id}</code>' in page.text
    assert f"held out: {frozen}@v1" in page.text
    assert '<span class="badge">training</span>' in page.text
