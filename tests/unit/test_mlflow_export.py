"""A run's series in MLflow tracking (a real file store): names, steps, params, re-export."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from web.cli_mlflow import RUN_ID_TAG, export_run, flat_params, metric_key, series_of

mlflow = pytest.importorskip("mlflow", reason="the tracking extra is part of the lock")


def _point(iteration: int, **numbers: Any) -> dict[str, Any]:
    return {"iteration": iteration, "created_at": f"2026-01-0{iteration + 1}T10:00:00+00:00",
            "alarms": [], "checkpoint_id": f"ck{iteration}", "loss": None,
            "extra_metrics": {"reward/tag/domain=math": 0.1 * iteration}, **numbers}


def _run(status: str = "running", **extra: Any) -> dict[str, Any]:
    return {"id": f"run-{uuid.uuid4().hex}", "name": "frozen lake", "submitted_by": "erin",
            "status": status, "base_checkpoint_id": "base1",
            "config": {"algorithm": {"lr": 1e-5, "group_size": 4}, "tasks": ["a", "b"],
                       "seed": 7, "notes": {}}, **extra}


def test_metric_keys_keep_what_mlflow_accepts() -> None:
    assert metric_key("reward/tag/domain=math") == "reward/tag/domain_math"
    assert metric_key("success/rate") == "success/rate"
    assert len(metric_key("x" * 400)) == 250


def test_series_are_every_number_at_its_iteration() -> None:
    series = series_of([_point(1, reward_mean=0.5, kl=0.01), _point(0, reward_mean=0.25)])
    assert [(p.step, p.key, p.value) for p in series] == [
        (0, "reward/tag/domain_math", 0.0), (0, "reward_mean", 0.25),
        (1, "kl", 0.01), (1, "reward/tag/domain_math", 0.1), (1, "reward_mean", 0.5)]
    assert series[0].timestamp_ms == 1767261600000  # 2026-01-01T10:00Z: when it was recorded
    assert [p.step for p in series_of([_point(0), _point(1), _point(2)], after=1)] == [2]


def test_params_are_the_config_flattened() -> None:
    assert dict(flat_params(_run()["config"])) == {
        "algorithm.lr": "1e-05", "algorithm.group_size": "4", "tasks": '["a", "b"]',
        "seed": "7", "notes": "{}"}


def test_export_writes_one_mlflow_run_and_adds_only_new_iterations(tmp_path: Path) -> None:
    uri = f"file:{tmp_path / 'mlruns'}"
    run = _run()
    first = export_run(run, [_point(0, reward_mean=0.2), _point(1, reward_mean=0.4)],
                       tracking_uri=uri, experiment="triloop")
    assert first.created and first.through_iteration == 1 and first.ended_as is None
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    stored = client.get_run(first.mlflow_run_id)
    assert stored.data.tags[RUN_ID_TAG] == run["id"]
    assert stored.data.tags["mlflow.runName"] == "frozen lake"
    assert stored.data.params["algorithm.lr"] == "1e-05"
    assert stored.info.status == "RUNNING"
    history = client.get_metric_history(first.mlflow_run_id, "reward_mean")
    assert [(m.step, m.value) for m in history] == [(0, 0.2), (1, 0.4)]

    # The run went on and completed: the same MLflow run gets iteration 2 only, and ends.
    again = export_run({**run, "status": "completed"},
                       [_point(0, reward_mean=0.2), _point(1, reward_mean=0.4),
                        _point(2, reward_mean=0.6)], tracking_uri=uri, experiment="triloop")
    assert not again.created and again.mlflow_run_id == first.mlflow_run_id
    assert again.values_logged == 2 and again.ended_as == "FINISHED"
    history = client.get_metric_history(first.mlflow_run_id, "reward_mean")
    assert [(m.step, m.value) for m in history] == [(0, 0.2), (1, 0.4), (2, 0.6)]
    assert client.get_run(first.mlflow_run_id).info.status == "FINISHED"
    experiment = client.get_experiment_by_name("triloop")
    assert experiment is not None
    assert len(client.search_runs([experiment.experiment_id])) == 1


def test_a_failed_run_with_no_iteration_ends_failed(tmp_path: Path) -> None:
    uri = f"file:{tmp_path / 'mlruns'}"
    result = export_run(_run("failed"), [], tracking_uri=uri, experiment="other")
    assert result.values_logged == 0 and result.through_iteration is None
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    assert client.get_run(result.mlflow_run_id).info.status == "FAILED"


def test_a_database_store_takes_the_same_export(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = export_run(_run("cancelled"), [_point(0, reward_mean=0.3)], tracking_uri=uri,
                        experiment="triloop")
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    assert client.get_run(result.mlflow_run_id).info.status == "KILLED"
    assert [m.value for m in client.get_metric_history(result.mlflow_run_id, "reward_mean")
            ] == [0.3]
