# ruff: noqa: F811  (tests take the imported ``deps`` fixture as an argument of that name)
"""The placebo control in offline eval, through the real PromotionWorkflow and activities.

The world's threshold gets a version that requires the placebo for production. The
candidate's run has a real config; a placebo run of it (``triloop.placebo.placebo_config``)
completed and wrote its last checkpoint. The promotion finds it when it opens, records and
requests a third eval batch for it exactly like the candidate's and production's, and
offline eval passes only when the candidate beats it by the margin. Without a placebo run,
the gate fails naming the command that makes one.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import text

from governance_loop.evalsets import set_threshold
from tests.factories import insert, make_checkpoint, make_task, uid
from tests.factories_governance import TEST_SPEC
from tests.integration.test_promotion_workflow import (  # noqa: F401  (the fixtures)
    Deps,
    _gates,
    _good,
    _rows,
    authorizer,
    deps,
    gov_settings,
    running,
)
from triloop.placebo import placebo_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MARGIN = 0.25


def _require_placebo(deps: Deps) -> None:
    """The world's threshold, next version: the placebo is required for production."""
    set_threshold(engine=deps.gov_engine, authorizer=deps.authorizer,
                  name=deps.world.threshold_name, eval_set=deps.world.eval_set_id,
                  spec={**TEST_SPEC, "placebo": {"required_for_aliases": ["production"],
                                                 "margin": MARGIN}},
                  requested_by="gov-admin")


def _candidate_config(deps: Deps) -> dict[str, Any]:
    """The candidate run trains on a task of its own (no eval task: held out)."""
    config = {"name": "lake run", "model": {"base": deps.world.baseline},
              "rollout": {"task_ids": [make_task(deps.owner)], "group_size": 4},
              "schedule": {"iterations": 4, "propose_every": 2, "seed": 3}}
    with deps.owner.begin() as conn:
        conn.execute(text("UPDATE training_run SET config = CAST(:c AS jsonb) WHERE id = :r"),
                     {"c": json.dumps(config), "r": deps.world.run_id})
    return config


def _placebo_run(deps: Deps, config: dict[str, Any]) -> str:
    """A completed placebo run of ``config`` with checkpoints at iterations 1 and 2; the
    last one's id."""
    run_id = uid("run-")
    insert(deps.owner, "training_run", id=run_id, submitted_by=deps.world.submitter,
           status="completed", iterations_done=2, name="lake run (placebo)",
           config=placebo_config(config))
    first = make_checkpoint(deps.owner, run_id=run_id, iteration=1,
                            parent_id=deps.world.baseline)
    return make_checkpoint(deps.owner, run_id=run_id, iteration=2, parent_id=first)


def _offline_evidence(deps: Deps) -> dict[str, Any]:
    (row,) = _rows(deps.owner, "SELECT g.evidence FROM gate_result g JOIN promotion p ON "
                   "p.id = g.promotion_id WHERE p.proposal_id = :p AND g.gate = 'offline_eval'",
                   p=deps.world.proposal_id)
    return dict(row[0])


def _batches(deps: Deps) -> dict[str, tuple[str, str, str]]:
    rows = _rows(deps.owner, "SELECT id, requested_by, purpose, checkpoint_id FROM rollout_batch"
                 " WHERE id LIKE :w", w=f"%{deps.world.proposal_id}%-eval-%")
    return {r[0].rsplit("-", 1)[1]: (r[1], r[2], r[3]) for r in rows}


async def test_without_a_placebo_run_offline_eval_fails_naming_the_command(deps: Deps) -> None:
    _require_placebo(deps)
    _candidate_config(deps)
    async with running(deps, _good(deps)) as run:
        final = await run.result()
    assert final.status == "rejected" and final.current_gate == "offline_eval"
    assert f"`triloop train placebo {deps.world.run_id}`" in (final.reason or "")
    placebo = _offline_evidence(deps)["placebo"]
    assert placebo["run_id"] is None and placebo["required_for"] == "production"
    assert set(_batches(deps)) == {"candidate", "production"}  # nothing to play


async def test_a_candidate_that_beats_the_placebo_by_the_margin_passes(deps: Deps) -> None:
    _require_placebo(deps)
    placebo = _placebo_run(deps, _candidate_config(deps))
    quality = _good(deps)
    quality.set(placebo, 0.5)  # the candidate succeeds always: 50 points ahead
    async with running(deps, quality) as run:
        await run.at_gate("shadow")
        assert (await run.status()).status == "open"
    evidence = _offline_evidence(deps)
    assert _gates(deps)["offline_eval"][1] is True
    assert evidence["placebo"]["checkpoint_id"] == placebo
    (judged,) = evidence["placebo"]["eval_sets"]
    assert judged["met"] and judged["placebo"]["episodes"] == 8
    assert (judged["candidate_success_rate"], judged["placebo_success_rate"]) == (1.0, 0.5)
    # Governance recorded and requested the placebo's batch like the other two.
    assert _batches(deps)["placebo"] == ("governance", "eval", placebo)
    assert evidence["batches_bound"]["placebo"].endswith("-placebo")


async def test_a_gain_the_placebo_also_makes_is_rejected(deps: Deps) -> None:
    _require_placebo(deps)
    placebo = _placebo_run(deps, _candidate_config(deps))
    quality = _good(deps)
    quality.set(placebo, 0.875)  # 12.5 points behind the candidate: short of 25
    async with running(deps, quality) as run:
        final = await run.result()
    assert final.status == "rejected" and final.current_gate == "offline_eval"
    assert "a gap of 12.5 points, the margin is 25.0 points" in (final.reason or "")
    assert f"checkpoint {placebo}" in (final.reason or "")
    (judged,) = _offline_evidence(deps)["placebo"]["eval_sets"]
    assert not judged["met"]
