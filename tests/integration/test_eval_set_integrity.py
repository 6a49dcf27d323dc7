"""The offline-eval gate recomputes its eval set's content hash and refuses a mismatch."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, text

from governance_loop.activities.evidence import EvidenceActivities
from governance_loop.contracts import OfflineEvalInput
from governance_loop.evalsets import create_eval_set, set_threshold
from tests.factories import make_task, uid
from tests.factories_governance import TEST_SPEC
from tests.factories_web import make_promotion
from triloop.config import Settings
from triloop.wiring import build_authorizer

pytestmark = pytest.mark.integration


def test_offline_eval_refuses_an_eval_set_changed_after_it_was_frozen(
    settings: Settings, role_engine: Any, owner_engine: Engine
) -> None:
    gov: Engine = role_engine("governance")
    authorizer = build_authorizer(settings, "governance")
    tasks = [make_task(owner_engine) for _ in range(3)]
    eval_set = create_eval_set(engine=gov, authorizer=authorizer, name=uid("es-"),
                               task_ids=tasks, requested_by="gov-admin")
    threshold = set_threshold(engine=gov, authorizer=authorizer, name=uid("thr-"),
                              spec=TEST_SPEC, eval_set=eval_set.id, requested_by="gov-admin")
    promotion = make_promotion(owner_engine, submitted_by="sam").promotion_id
    gate = EvidenceActivities(gov, authorizer)
    request = OfflineEvalInput(promotion_id=promotion, threshold_id=threshold.id,
                               eval_set_id=eval_set.id, candidate_batch_id=uid("batch-"),
                               production_batch_id=None)

    intact = gate.decide_offline_eval(request)
    assert not any("content hash" in reason for reason in intact.reasons), intact.reasons

    # The owner changes what an item means (its task's seed): no trigger guards tasks.
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE task SET seed = seed + 1000 WHERE id = :t"), {"t": tasks[1]})
    refused = gate.decide_offline_eval(request)
    assert not refused.passed and refused.verdict == "fail"
    (reason,) = refused.reasons
    assert "no longer matches its frozen content hash" in reason and eval_set.id in reason
    with owner_engine.begin() as conn:
        stored = conn.execute(text("SELECT passed, reasons FROM gate_result WHERE id = :g"),
                              {"g": refused.gate_result_id}).one()
    assert stored[0] is False and stored[1] == [reason]
