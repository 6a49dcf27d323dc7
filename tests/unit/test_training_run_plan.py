"""The training-run workflow's pure helpers: rollout groups, proposals, stored records."""

from __future__ import annotations

import math

import pytest
from temporalio import workflow

from learning_loop.activities.run_state import proposal_id_for
from learning_loop.contracts import TaskSeed
from learning_loop.iteration_records import finite, stability_history
from learning_loop.stability import IterationMetrics
from learning_loop.workflows import TrainingRunWorkflow, rollout_items
from triloop.run_config import RunConfig
from triloop.temporal import DATA_CONVERTER
from triloop.workflow_api import TrainingRunInput


def test_rollout_groups_cycle_through_the_tasks_across_iterations() -> None:
    tasks = [TaskSeed("t1", 1, "v"), TaskSeed("t2", 2, "v"), TaskSeed("t3", 3, "v")]
    first = rollout_items(tasks, 1, groups=2, group_size=4)
    second = rollout_items(tasks, 2, groups=2, group_size=4)
    assert [(i.task_id, i.seed, i.group_size) for i in first] == [("t1", 1, 4), ("t2", 2, 4)]
    assert [i.task_id for i in second] == ["t3", "t1"]


def test_a_proposal_id_is_fixed_by_run_and_iteration() -> None:
    assert proposal_id_for("run-1", 5) == proposal_id_for("run-1", 5)
    assert proposal_id_for("run-1", 5) != proposal_id_for("run-1", 10)
    assert proposal_id_for("run-1", 5) != proposal_id_for("run-2", 5)


def test_stored_columns_have_no_nan_and_monitors_round_trip() -> None:
    metrics = IterationMetrics(3, -0.5, 0.1, 0.05, 0.25, 4.2, float("nan"), None, 4.0, 8.0, 12,
                               0.5, 0.125, 8)
    stored = finite({"stability": metrics.as_dict(), "loss": float("inf")})
    assert stored["loss"] is None and stored["stability"]["grad_norm"] is None
    (restored,) = stability_history([stored, {"update": None}])
    assert restored.iteration == 3 and restored.retrieval_accuracy == 0.5
    assert not any(isinstance(v, float) and math.isnan(v) for v in stored["stability"].values())


def test_an_invalid_config_fails_the_run_without_retrying() -> None:
    # A client that skipped the web's validation: decoding the input refuses the config,
    # with an exception type the workflow declares a failure (no retry of its first task).
    converter = DATA_CONVERTER.payload_converter
    payloads = converter.to_payloads([{"run_id": "r", "submitted_by": "u", "config": {
        "name": "x", "model": {"base": "m"}, "rollout": {"task_ids": []}}}])
    failures = workflow._Definition.from_class(TrainingRunWorkflow).failure_exception_types
    with pytest.raises(Exception) as error:
        converter.from_payloads(payloads, [TrainingRunInput])
    assert isinstance(error.value, tuple(failures)) and "rollout.task_ids" in str(error.value)


def test_the_run_config_crosses_temporal_typed() -> None:
    config = RunConfig.model_validate({"name": "x", "model": {"base": "m"},
                                       "rollout": {"task_ids": ["t"], "max_new_tokens": 7}})
    sent = TrainingRunInput(run_id="r", submitted_by="u", config=config)
    converter = DATA_CONVERTER.payload_converter
    (received,) = converter.from_payloads(converter.to_payloads([sent]), [TrainingRunInput])
    assert isinstance(received.config, RunConfig) and received.config == config
