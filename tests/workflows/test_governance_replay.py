"""A recorded PromotionWorkflow history replays on today's code (no services needed).

A change to the workflow that would break promotions in flight (a new activity
call, a reordered timer) fails here; guard such changes with ``workflow.patched()``.
The history comes from ``tests/integration/test_promotion_workflow.py``'s whole
path to promotion; rerun it with ``TRILOOP_RECORD_HISTORIES=1`` to refresh it after
a deliberate, patched change.
"""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from governance_loop.workflows import GovernanceWriteWorkflow, PromotionWorkflow
from triloop.temporal import DATA_CONVERTER

RECORDED = Path(__file__).parent / "histories" / "promotion_workflow.json"
# From tests/integration/test_api_governance_writes.py (an operator registers a version).
RECORDED_WRITE = Path(__file__).parent / "histories" / "governance_write.json"


async def test_recorded_promotion_replays() -> None:
    recorded = json.loads(RECORDED.read_text())
    history = WorkflowHistory.from_json(recorded["workflow_id"], recorded["history"])
    replayer = Replayer(workflows=[PromotionWorkflow], data_converter=DATA_CONVERTER)
    result = await replayer.replay_workflow(history)
    assert result.replay_failure is None


async def test_recorded_governance_write_replays() -> None:
    recorded = json.loads(RECORDED_WRITE.read_text())
    history = WorkflowHistory.from_json(recorded["workflow_id"], recorded["history"])
    replayer = Replayer(workflows=[GovernanceWriteWorkflow], data_converter=DATA_CONVERTER)
    result = await replayer.replay_workflow(history)
    assert result.replay_failure is None
