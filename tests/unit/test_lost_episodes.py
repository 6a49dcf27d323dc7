"""Why a batch lost its episodes, in words: the cause a timeout or a stall carries, and the
run's failure when a whole batch came back empty (pure functions)."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as TemporalTimeout

from execution_loop.contracts import HeartbeatReport
from execution_loop.group_runner import stall_error
from execution_loop.workflows import deadline_cause, heartbeat_report, lost_cause
from learning_loop.workflows import lost_batch
from triloop.workflow_api import RolloutBatchResult


def timeout(kind: TimeoutType, stage: str = "", cause: BaseException | None = None
            ) -> TemporalTimeout:
    details = [3, {"steps": 3, "stage": stage, "silent_s": 1.5}] if stage else []
    error = TemporalTimeout("activity timeout", type=kind, last_heartbeat_details=details)
    if cause is not None:
        error.__cause__ = cause
    return error


def test_a_stalled_group_names_its_stage_and_is_not_retried() -> None:
    stage = "decoding turn 3 of episode b:0:1 (12 tokens so far)"
    error = stall_error(HeartbeatReport(steps=2, stage=stage, silent_s=60.0), 60.0)
    assert error.non_retryable and error.type == "HeartbeatTimeout"
    assert lost_cause(error, 60.0) == (
        f"heartbeat timeout while {stage}: no progress for 60 s (rollout.heartbeat_timeout_s;"
        " raise it for a model slower than that per token)")


def test_a_timeout_in_temporal_names_the_stage_of_its_last_heartbeat() -> None:
    loading = lost_cause(timeout(TimeoutType.HEARTBEAT, "loading checkpoint abcdef012345"), 60)
    assert loading is not None
    assert loading.startswith("heartbeat timeout while loading checkpoint abcdef012345:")
    assert "sent no heartbeat for 60 s" in loading
    silent = lost_cause(timeout(TimeoutType.HEARTBEAT), 5)
    assert silent is not None and silent.startswith("heartbeat timeout: ")
    late = lost_cause(timeout(TimeoutType.SCHEDULE_TO_CLOSE, "starting episode e"), 5)
    assert late == "the batch deadline passed with the episodes still running while starting" \
        " episode e"


def test_other_failures_are_not_lost_but_failed() -> None:
    assert lost_cause(ApplicationError("ValueError: bad", type="ValueError"), 60) is None
    assert heartbeat_report([4]) == HeartbeatReport()  # a history from before reports
    assert heartbeat_report([4, {"stage": "x", "extra": 1}]).stage == "x"


def test_a_batch_that_lost_every_episode_fails_the_run_with_the_cause() -> None:
    why = "heartbeat timeout while decoding turn 1 of episode b:0:0 (no progress for 60 s)"
    batch = RolloutBatchResult(batch_id="b", statuses={"b:0:0": "truncated",
                                                      "b:0:1": "truncated",
                                                      "b:1:0": "truncated"},
                               lost={"b:0:0": why, "b:0:1": why,
                                     "b:1:0": deadline_cause(600, started=False)})
    message = lost_batch(batch)
    assert message == (
        "rollout batch b came back empty: all 3 episodes were lost (2 episode(s): "
        f"{why}; 1 episode(s): the batch deadline (rollout.deadline_s = 600 s) passed "
        "before it started)")
    batch.lost.pop("b:1:0")  # one episode came back: the update decides
    assert lost_batch(batch) is None
    assert lost_batch(RolloutBatchResult(batch_id="empty")) is None
