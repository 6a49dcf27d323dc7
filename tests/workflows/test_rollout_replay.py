"""Recorded RolloutWorkflow histories replay on today's code (no services needed).

One history is a production batch (routing activity, canary and shadow episodes),
the other a training batch cut by its deadline (episodes that never started are
recorded by the truncation activity). A change that would break batches in
flight fails here: guard it with ``workflow.patched()``. They were recorded from a
real execution worker on the dev stack (``handle.fetch_history()`` then
``history.to_json()``); record them again the same way after a patched change.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from execution_loop.workflows import RolloutWorkflow
from triloop.temporal import DATA_CONVERTER

HISTORIES = Path(__file__).parent / "histories"


@pytest.mark.parametrize(
    "name", ["rollout_production_canary_shadow", "rollout_deadline_truncation"]
)
async def test_recorded_rollout_replays(name: str) -> None:
    history = WorkflowHistory.from_json(name, (HISTORIES / f"{name}.json").read_text())
    replayer = Replayer(workflows=[RolloutWorkflow], data_converter=DATA_CONVERTER)
    result = await replayer.replay_workflow(history)
    assert result.replay_failure is None
