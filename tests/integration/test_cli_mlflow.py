"""``triloop train mlflow-export``: a run's series, read through the API, in MLflow tracking."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import typer
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from tests.factories import insert, make_run
from tests.factories_web import Person, add_steps
from web.cli_mlflow import RUN_ID_TAG, mlflow_app

mlflow = pytest.importorskip("mlflow", reason="the tracking extra is part of the lock")

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures", "tests.integration.cli_app"]


@pytest.fixture
def train_cli(app_cli: typer.Typer) -> typer.Typer:
    """``train`` with the export command, as triloop mounts it (app_cli routes httpx in)."""
    root = typer.Typer()
    root.add_typer(mlflow_app, name="train")
    return root


def test_export_through_the_api_by_prefix_then_again_after_more_iterations(
    train_cli: typer.Typer, owner_engine: Engine, people: dict[str, Person], tmp_path: Path
) -> None:
    engineer = people["engineer"]
    run_id = make_run(owner_engine, submitted_by=engineer.name)
    add_steps(owner_engine, run_id, 3)
    uri = f"file:{tmp_path / 'mlruns'}"
    args = ["train", "mlflow-export", run_id[:20], "--tracking-uri", uri, "--token",
            engineer.token]
    first = CliRunner().invoke(train_cli, args)
    assert first.exit_code == 0, first.output
    assert f"exported run {run_id}" in first.output and "through iteration 2" in first.output

    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("triloop")
    assert experiment is not None
    [exported] = client.search_runs([experiment.experiment_id])
    assert exported.data.tags[RUN_ID_TAG] == run_id
    assert exported.data.tags["triloop.submitted_by"] == engineer.name
    rewards = client.get_metric_history(exported.info.run_id, "reward_mean")
    assert [m.step for m in rewards] == [0, 1, 2]
    assert [round(m.value, 6) for m in rewards] == [0.2, 0.25, 0.3]

    # The run trains on and completes: the next export adds iteration 3 and ends the run.
    insert(owner_engine, "training_step", run_id=run_id, iteration=3, loss=0.8,
           reward_mean=0.35, alarms=[], length_stats={}, metrics={})
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE training_run SET status = 'completed' WHERE id = :r"),
                     {"r": run_id})
    again = CliRunner().invoke(train_cli, [*args, "--output", "json"])
    assert again.exit_code == 0, again.output
    assert '"created": false' in again.output and '"through_iteration": 3' in again.output
    rewards = client.get_metric_history(exported.info.run_id, "reward_mean")
    assert [m.step for m in rewards] == [0, 1, 2, 3]
    assert client.get_run(exported.info.run_id).info.status == "FINISHED"


def test_export_refusals_are_sentences(
    train_cli: typer.Typer, people: dict[str, Person], tmp_path: Path
) -> None:
    uri = f"file:{tmp_path / 'mlruns'}"
    unknown = CliRunner().invoke(train_cli, ["train", "mlflow-export", "run-no-such-run",
                                             "--tracking-uri", uri, "--token",
                                             people["engineer"].token])
    assert unknown.exit_code == 1 and "run-no-such-run" in unknown.output
    no_token = CliRunner().invoke(train_cli, ["train", "mlflow-export", "run-x",
                                              "--tracking-uri", uri], env={"TRILOOP_TOKEN": ""})
    assert no_token.exit_code == 2 and "no API token" in no_token.output
    assert not (tmp_path / "mlruns").exists()  # nothing written for a refused export


def test_a_tracking_uri_mlflow_cannot_take_is_a_sentence(
    train_cli: typer.Typer, owner_engine: Engine, people: dict[str, Person]
) -> None:
    run_id = make_run(owner_engine, submitted_by=people["engineer"].name)
    refused = CliRunner().invoke(train_cli, ["train", "mlflow-export", run_id,
                                             "--tracking-uri", "bogus://nowhere", "--token",
                                             people["engineer"].token])
    assert refused.exit_code == 1, refused.output
    assert f"MLflow could not take run {run_id} at bogus://nowhere" in refused.output
    assert "unsupported URI" in refused.output and "Traceback" not in refused.output


def test_export_all_runs_of_a_person(
    train_cli: typer.Typer, owner_engine: Engine, people: dict[str, Person], tmp_path: Path
) -> None:
    submitter = f"mlflow-{uuid.uuid4().hex[:8]}"  # no other test's runs are theirs
    runs = [make_run(owner_engine, submitted_by=submitter) for _ in range(2)]
    for run_id in runs:
        add_steps(owner_engine, run_id, 2)
    uri = f"file:{tmp_path / 'mlruns'}"
    done = CliRunner().invoke(train_cli, [
        "train", "mlflow-export", "--all", "--submitted-by", submitter, "--tracking-uri", uri,
        "--experiment", "everyone", "--token", people["engineer"].token, "--output", "json"])
    assert done.exit_code == 0, done.output
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("everyone")
    assert experiment is not None
    exported = {r.data.tags[RUN_ID_TAG] for r in client.search_runs([experiment.experiment_id])}
    assert exported == set(runs)
    both = CliRunner().invoke(train_cli, ["train", "mlflow-export", runs[0], "--all",
                                          "--token", people["engineer"].token])
    assert both.exit_code == 2 and "not both" in both.output
    neither = CliRunner().invoke(train_cli, ["train", "mlflow-export", "--token",
                                             people["engineer"].token])
    assert neither.exit_code == 2 and "or pass --all" in neither.output
