"""Governance test helpers: a promotion's world, and a stand-in execution loop.

The stand-in is a collaborator the governance tests are not about: a
``RolloutWorkflow`` registered under the real name on the test's execution queue,
and a traffic generator that serves "production" episodes the way the execution
loop does (reading governance's routing table, shadowing, canary share), writing
trajectories as the execution role with success rates the test controls.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, text
from temporalio import activity, workflow
from temporalio.worker import Worker

from governance_loop.activities.evidence import EvidenceActivities
from governance_loop.contracts import CanaryLook
from tests.factories import insert, make_checkpoint, make_run, make_task, uid
from tests.temporal_helpers import execution_nexus, loop_client
from triloop.config import Settings
from triloop.wiring import build_authorizer
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    ROLLOUT_WORKFLOW,
    RolloutBatchInput,
    RolloutBatchResult,
)

TEST_SPEC: dict[str, Any] = {
    "min_success_rate": 0.5,
    "max_regression_vs_production": 0.2,
    "min_samples": 8,
    "shadow": {"min_samples": 5, "agreement_floor": 0.8, "max_mean_reward_regression": 0.2},
    "canary": {"min_samples_per_arm": 10, "regression_to_detect": 0.3},
    "watch": {"min_samples": 10, "regression_to_detect": 0.3},
    # These tests are not about attribution (test_reward_attribution.py is): their stand-in
    # verdicts and tiny random models gain reward by noise.
    "attribution": {"min_task_share": None},
}


@dataclass
class Quality:
    """Success rate per (checkpoint, purpose); purpose None is the checkpoint's default."""

    rates: dict[tuple[str, str | None], float] = field(default_factory=dict)
    counters: dict[tuple[str, str], int] = field(default_factory=dict)

    def set(self, checkpoint: str, rate: float, purpose: str | None = None) -> None:
        """Set a rate (for one purpose, or the default)."""
        self.rates[(checkpoint, purpose)] = rate

    def success(self, checkpoint: str, purpose: str) -> bool:
        """Deterministic: exactly ``rate`` of successive episodes succeed."""
        rate = self.rates.get((checkpoint, purpose), self.rates.get((checkpoint, None), 0.9))
        n = self.counters.get((checkpoint, purpose), 0)
        self.counters[(checkpoint, purpose)] = n + 1
        return int((n + 1) * rate + 1e-9) > int(n * rate + 1e-9)


def _write(engine: Engine, rows: list[dict[str, Any]], requester: Engine | None = None,
           verifier: Engine | None = None) -> None:
    if requester is not None:
        request_batches(requester, rows)
    if verifier is None:
        _store_episodes(engine, rows)
    else:
        judge_as_written(verifier, rows, store=lambda: _store_episodes(engine, rows))


# The lock the verifier claims an episode with (``verifier.store``): while the stand-in
# holds it, a running verifier skips the episode, and finds the stand-in's verdict after.
_CLAIM_LOCKS = ("SELECT {fn}(hashtextextended('verdict:' || k, 0)) "
                "FROM unnest(CAST(:k AS text[])) AS k")


def judge_as_written(verifier: Engine, rows: list[dict[str, Any]],
                     store: Callable[[], None] = lambda: None) -> None:
    """The stand-in verifier (as ``triloop_verifier``; ``verifier`` is its engine or the
    owner's): ``store()`` the episodes, then a verdict agreeing with each row, holding the
    verifier's claim on them throughout.

    For episodes on the tests' contract-less tasks, which no environment can replay; the
    real verifier (``verifier/``) is tested on real environments."""
    ids = [row["id"] for row in rows]
    with verifier.connect() as conn:
        # The verifier's role (the owner, in set-up, may take it): the database stamps it.
        conn.execute(text("SET ROLE triloop_verifier"))
        conn.execute(text(_CLAIM_LOCKS.format(fn="pg_advisory_lock")), {"k": ids})
        try:
            store()
            for row in rows:
                conn.execute(text(
                    "INSERT INTO verdict (trajectory_id, batch_id, success, total_reward, "
                    "agrees) VALUES (:id, :batch_id, :success, :reward, true) "
                    "ON CONFLICT (trajectory_id) DO NOTHING"),
                    {**row, "reward": 1.0 if row["success"] else 0.0})
            conn.commit()
        finally:
            conn.rollback()
            conn.execute(text(_CLAIM_LOCKS.format(fn="pg_advisory_unlock")), {"k": ids})
            conn.execute(text("RESET ROLE"))
            conn.commit()


def _store_episodes(engine: Engine, rows: list[dict[str, Any]]) -> None:
    with engine.begin() as conn:
        for row in rows:
            conn.execute(text(
                "INSERT INTO trajectory (id, batch_id, task_id, checkpoint_id, purpose, group_id, "
                "sample_index, policy_version, status, success, total_reward, num_steps, outcome)"
                " VALUES (:id, :batch_id, :task_id, :checkpoint_id, :purpose, :group_id, 0, 0, "
                "'completed', :success, :reward, 1, CAST(:outcome AS jsonb)) "
                "ON CONFLICT (id) DO NOTHING"
            ), {**row, "reward": 1.0 if row["success"] else 0.0,
                "outcome": json.dumps(row.get("outcome", {}))})
            # A shadow's one step saw what production saw and acted alike, as the
            # execution loop records it (``feedback.shadow_agreement``).
            feedback = {"shadow_agreement": {"compared": True, "agreed": True,
                                             "production_action": "act"}} \
                if row["purpose"] == "shadow" else {}
            conn.execute(text(
                "INSERT INTO step (trajectory_id, index, observation, action_text, reward, done,"
                " feedback) VALUES (:id, 0, 'obs', 'act', :reward, true, CAST(:f AS jsonb)) "
                "ON CONFLICT DO NOTHING"
            ), {"id": row["id"], "reward": 1.0 if row["success"] else 0.0,
                "f": json.dumps(feedback)})


# Who asks for a batch of each purpose (the stand-in's traffic is people's, via the web).
REQUESTER = {"production": "web", "shadow": "web", "canary": "web", "training": "learning"}


def request_batches(requester: Engine, rows: list[dict[str, Any]]) -> None:
    """The ``rollout_batch`` rows of these episodes, as their requesters record them before
    asking: planned episodes are exactly these (a shadow stands for its production episode).
    ``requester`` is the owner (set-up) or the requester's own role. Rows already there
    (an eval batch governance recorded) are left as they are."""
    batches: dict[str, dict[str, Any]] = {}
    for row in rows:
        batch = batches.setdefault(row["batch_id"], {"purpose": row["purpose"], "plan": {}})
        if row["purpose"] != "shadow":
            batch["plan"][row["id"]] = {"task_id": row["task_id"], "seed": 0}
        if row["purpose"] in ("shadow", "canary"):
            batch["purpose"] = "production"
    with requester.begin() as conn:
        for batch_id, batch in batches.items():
            conn.execute(text(
                "INSERT INTO rollout_batch (id, purpose, requested_by, planned_episodes) "
                "VALUES (:b, :p, :r, CAST(:plan AS jsonb)) ON CONFLICT (id) DO NOTHING"),
                {"b": batch_id, "p": batch["purpose"],
                 "r": REQUESTER.get(batch["purpose"], "governance"),
                 "plan": json.dumps(batch["plan"])})


def write_episodes(engine: Engine, rows: list[dict[str, Any]], *,
                   requester: Engine | None = None, verifier: Engine | None = None) -> None:
    """Store episodes as the execution loop does: id, batch_id, task_id, checkpoint_id,
    purpose, group_id, success, optionally outcome (e.g. ``injected_fault``, ``shadow_of``).

    ``requester`` first records their batches (``request_batches``); None: they are.
    ``verifier`` then judges them as written (``judge_as_written``); None: nobody yet."""
    _write(engine, rows, requester, verifier)


class StandInExecution:
    """Eval batches (child workflows) and production traffic, as the execution role."""

    def __init__(self, engine: Engine, quality: Quality, task_id: str, *,
                 requester: Engine, verifier: Engine) -> None:
        self.engine = engine
        self.requester = requester  # records the traffic's batches, as the web service does
        self.verifier = verifier  # judges the episodes as written (the stand-in verifier)
        self.quality = quality
        self.task_id = task_id
        self.served = 0

    @activity.defn(name="standin_rollout_batch")
    def rollout_batch(self, batch: RolloutBatchInput) -> RolloutBatchResult:
        """Write every episode of an eval batch."""
        assert batch.checkpoint_id is not None
        rows: list[dict[str, Any]] = []
        for i, item in enumerate(batch.items):
            for sample in range(item.group_size):
                rows.append({
                    "id": f"{batch.batch_id}:{i}:{sample}", "batch_id": batch.batch_id,
                    "task_id": item.task_id, "checkpoint_id": batch.checkpoint_id,
                    "purpose": batch.purpose, "group_id": f"{batch.batch_id}:{i}",
                    "success": self.quality.success(batch.checkpoint_id, batch.purpose),
                })
        _write(self.engine, rows, verifier=self.verifier)
        wins = sum(1 for r in rows if r["success"])
        return RolloutBatchResult(batch_id=batch.batch_id, trajectory_ids=[r["id"] for r in rows],
                                  completed=len(rows), success_rate=wins / max(1, len(rows)))

    def serve_tick(self, episodes: int) -> None:
        """Serve a few production episodes following governance's routing table."""
        with self.engine.connect() as conn:
            routes = {r[0]: (r[1], float(r[2])) for r in conn.execute(
                text("SELECT slot, checkpoint_id, share FROM routing")).all()}
        production = routes.get("production", (None, 0.0))[0]
        canary, share = routes.get("canary", (None, 0.0))
        shadow = routes.get("shadow", (None, 0.0))[0]
        if production is None:
            return
        rows = []
        batch_id = f"traffic-{uuid.uuid4().hex}"
        for index in range(episodes):
            self.served += 1
            eid = f"{batch_id}:{index}:0"
            bucket = int(hashlib.sha256(eid.encode()).hexdigest()[:8], 16) / 2**32
            if canary and bucket < share:
                rows.append(self._row(eid, batch_id, canary, "canary"))
                continue
            rows.append(self._row(eid, batch_id, production, "production"))
            if shadow and shadow != production:
                row = self._row(f"{eid}:shadow", batch_id, shadow, "shadow")
                row["outcome"] = {"shadow_of": eid}
                rows.append(row)
        _write(self.engine, rows, self.requester, self.verifier)

    def _row(self, eid: str, batch_id: str, checkpoint: str, purpose: str) -> dict[str, Any]:
        return {"id": eid, "batch_id": batch_id, "task_id": self.task_id,
                "checkpoint_id": checkpoint, "purpose": purpose, "group_id": eid,
                "success": self.quality.success(checkpoint, purpose)}


@workflow.defn(name=ROLLOUT_WORKFLOW, sandboxed=False)
class StandInRolloutWorkflow:
    """Stands in for the execution loop's RolloutWorkflow: one activity writes the batch."""

    @workflow.run
    async def run(self, batch: RolloutBatchInput) -> RolloutBatchResult:
        """Write the batch's episodes."""
        result: RolloutBatchResult = await workflow.execute_activity(
            "standin_rollout_batch", batch, result_type=RolloutBatchResult,
            start_to_close_timeout=timedelta(seconds=60),
        )
        return result


@contextlib.asynccontextmanager
async def execution_stand_in(
    settings: Settings, execution: StandInExecution, *,
    episodes_per_tick: int = 4, tick_s: float = 0.1,
) -> AsyncIterator[StandInExecution]:
    """Run the stand-in execution worker and production traffic until the block ends.

    It polls the execution namespace with execution's token and answers governance through
    the real Nexus handlers, which start the stand-in rollout workflow.
    """
    from concurrent.futures import ThreadPoolExecutor

    client = await loop_client(settings, "execution", "execution-stand-in")
    worker = Worker(client, task_queue=settings.task_queue(EXECUTION_QUEUE),
                    workflows=[StandInRolloutWorkflow], activities=[execution.rollout_batch],
                    activity_executor=ThreadPoolExecutor(4),
                    nexus_service_handlers=[execution_nexus(settings)])

    async def traffic() -> None:
        while True:
            await asyncio.to_thread(execution.serve_tick, episodes_per_tick)
            await asyncio.sleep(tick_s)

    async with worker:
        task = asyncio.create_task(traffic())
        try:
            yield execution
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@dataclass
class PromotionWorld:
    """Rows a promotion needs: checkpoints, a run, a proposal, an eval set and a threshold."""

    baseline: str
    candidate: str
    run_id: str
    proposal_id: str
    task_ids: list[str]
    eval_set_id: str
    threshold_id: str
    threshold_name: str
    submitter: str = "alice"


def make_world(
    owner: Engine, gov_engine: Engine, authorizer: Any, *, threshold_name: str,
    spec: dict[str, Any] | None = None, submitter: str = "alice",
) -> PromotionWorld:
    """Everything a promotion of a fresh candidate needs, production bootstrapped to baseline."""
    from governance_loop.activities.rollback import bootstrap_production
    from governance_loop.evalsets import create_eval_set, set_threshold

    baseline = make_checkpoint(owner)
    candidate = make_checkpoint(owner, parent_id=baseline)
    run_id = make_run(owner, submitted_by=submitter)
    proposal_id = uid("prop-")
    insert(owner, "proposal", id=proposal_id, checkpoint_id=candidate, run_id=run_id,
           submitted_by=submitter, evidence={})
    tasks = [make_task(owner), make_task(owner)]
    eval_set = create_eval_set(engine=gov_engine, authorizer=authorizer, name=uid("es-"),
                               task_ids=tasks, requested_by="gov-admin")
    threshold = set_threshold(engine=gov_engine, authorizer=authorizer, name=threshold_name,
                              spec=spec or TEST_SPEC, eval_set=eval_set.id,
                              requested_by="gov-admin")
    bootstrap_production(engine=gov_engine, authorizer=authorizer, checkpoint_id=baseline,
                         requested_by="gov-admin", replace=True)
    return PromotionWorld(baseline, candidate, run_id, proposal_id, tasks, eval_set.id,
                          threshold.id, threshold_name, submitter)


async def wait_for(predicate: Callable[[], Any], *, timeout: float, what: str,
                   interval: float = 0.2) -> Any:
    """Poll an (async or sync) predicate until it returns something truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


@dataclass
class Scene:
    """A promotion under judgement, the evidence activities, and the window's start."""

    owner: Engine
    execution: Engine
    world: PromotionWorld
    promotion_id: str
    activities: EvidenceActivities
    since: datetime
    governance: Engine  # governance's own role: it records its eval batches
    verifier: Engine  # the verifier's own role: its verdicts are what offline eval counts

    def fault(self, checkpoint: str) -> dict[str, Any]:
        return {"checkpoint_id": checkpoint, "temperature": 8.0, "note": "game day"}

    def episodes(self, checkpoint: str, purpose: str, successes: list[bool],
                 outcome: dict[str, Any] | None = None) -> list[str]:
        batch_id = uid("traffic-")
        ids = [f"{batch_id}:{i}:0" for i in range(len(successes))]
        write_episodes(self.execution, [
            {"id": e, "batch_id": batch_id, "task_id": self.world.task_ids[0],
             "checkpoint_id": checkpoint, "purpose": purpose, "group_id": e, "success": ok,
             "outcome": outcome or {}}
            for e, ok in zip(ids, successes, strict=True)], requester=self.owner,
            verifier=self.verifier)
        return ids

    def gate_row(self, gate: str) -> tuple[bool, list[str], dict[str, Any]]:
        with self.owner.connect() as conn:
            row = conn.execute(text(
                "SELECT passed, reasons, evidence FROM gate_result WHERE promotion_id = :p "
                "AND gate = :g"), {"p": self.promotion_id, "g": gate}).one()
        return bool(row[0]), list(row[1]), dict(row[2])


def make_scene(settings: Settings, owner_engine: Engine, role_engine: Any) -> Scene:
    """A promotion opened on a fresh world, judged by the real evidence activities."""
    governance = role_engine("governance")
    authorizer = build_authorizer(settings, "governance")
    world = make_world(owner_engine, governance, authorizer, threshold_name=uid("thr-"))
    promotion_id = uid("promo-")
    insert(owner_engine, "promotion", id=promotion_id, proposal_id=world.proposal_id,
           checkpoint_id=world.candidate, run_id=world.run_id, submitted_by=world.submitter,
           status="open")
    with owner_engine.connect() as conn:
        since = conn.execute(text("SELECT now()")).scalar_one()
    return Scene(owner_engine, role_engine("execution"), world, promotion_id,
                 EvidenceActivities(governance, authorizer), since, governance,
                 role_engine("verifier"))


def look_canary(scene: Scene, *, soak_complete: bool) -> Any:
    """One canary look over the scene's window, as the promotion workflow asks for it."""
    return scene.activities.look_canary(CanaryLook(
        promotion_id=scene.promotion_id, threshold_id=scene.world.threshold_id,
        candidate_checkpoint_id=scene.world.candidate,
        production_checkpoint_id=scene.world.baseline, since=scene.since.isoformat(),
        soak_complete=soak_complete))
