"""The shadow gate counts the per-step agreement the execution loop recorded.

Real multi-step shadow episodes: the execution worker plays frozen_lake for production and
for its shadow on the real Temporal, PostgreSQL and OPA, with scripted policies (the
policy is a collaborator this test is not about). Both policies write an invalid move,
which leaves the grid unchanged, until the shadow makes one real move at turn 3; from
then on its own copy of the lake differs, so its later steps are not comparable, even
though their action text equals production's step of the same index. The governance
activity must judge the shadow on exactly the steps execution compared.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from temporalio.client import Client

from execution_loop.activities import episode_seed
from execution_loop.environments.frozen_lake import MOVES, TOKENS, _move, generate_map
from execution_loop.episode import turn_seed
from execution_loop.inference.base import FINISH_STOP, Generation, PolicyClient
from execution_loop.worker import build_worker
from governance_loop.activities.evidence import EvidenceActivities
from governance_loop.contracts import ShadowInput
from tests.factories import insert, uid
from tests.factories_execution import (
    make_builtin_task,
    register_variant,
    request_batch,
    set_routing,
)
from tests.factories_governance import make_world
from triloop.config import Settings
from triloop.temporal import connect
from triloop.wiring import build_authorizer
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    ROLLOUT_WORKFLOW,
    RolloutBatchInput,
    RolloutBatchResult,
    RolloutItem,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = 21
EPISODES = 3
DIVERGE_AT = 2  # 0-based turn at which the shadow makes its one real move
MAX_TURNS = 10  # frozen_lake's contract


class ScriptedPolicy:
    """Writes ``script(turn)``; the turn is recovered from the episode's turn seed."""

    def __init__(self, checkpoint_id: str, model_dir: Path, moves: dict[int, str],
                 turns: dict[int, int]) -> None:
        from transformers import AutoTokenizer

        self.checkpoint_id = checkpoint_id
        self._tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._moves = moves
        self._turns = turns

    def tokenizer(self) -> Any:
        return self._tokenizer

    def generate(self, prompt_token_ids: list[int], *, max_new_tokens: int, temperature: float,
                 seed: int | None, stop_token_ids: Sequence[int] = ()) -> Generation:
        del prompt_token_ids, max_new_tokens, temperature, stop_token_ids
        assert seed is not None
        action = self._moves.get(self._turns[seed], "x")  # "x" is no move: the grid stays
        ids = list(self._tokenizer.encode(action, add_special_tokens=False))
        return Generation(token_ids=ids, logprobs=[-0.1] * len(ids), text=action,
                          finish_reason=FINISH_STOP)


def safe_move(seed: int) -> str:
    """A move from the start onto plain ice (not a hole, not the goal, not the edge)."""
    lake = generate_map(seed)
    for move in MOVES:
        cell = _move(lake, lake.start, move)
        if cell != lake.start and cell not in lake.holes and cell != lake.goal:
            return TOKENS[move]
    raise AssertionError(f"seed {seed}: no safe first move")


@pytest.fixture
def routing(owner_engine: Engine) -> Iterator[None]:
    """Leave governance's routing table as it was found."""
    with owner_engine.connect() as conn:
        saved = conn.execute(text("SELECT slot, checkpoint_id, share FROM routing")).all()
    yield
    with owner_engine.begin() as conn:
        conn.execute(text("DELETE FROM routing"))
    for slot, checkpoint_id, share in saved:
        set_routing(owner_engine, slot, checkpoint_id, share)


@pytest.mark.usefixtures("routing", "verifier_service")
async def test_shadow_gate_counts_only_steps_execution_compared(
    settings: Settings, owner_engine: Engine, role_engine: Any, tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    production = register_variant(owner_engine, tiny_model_dir, tmp_path / "p")
    candidate = register_variant(owner_engine, tiny_model_dir, tmp_path / "c")
    task = make_builtin_task(owner_engine, "frozen_lake", seed=SEED)
    batch = RolloutBatchInput(batch_id=f"b{uuid.uuid4().hex[:10]}", purpose="production",
                              items=[RolloutItem(task, SEED, group_size=EPISODES)],
                              max_concurrency=1, deadline_s=240)
    episode_ids = [f"{batch.batch_id}:0:{i}" for i in range(EPISODES)]
    turns = {turn_seed(episode_seed(e), i): i for e in episode_ids for i in range(MAX_TURNS)}
    scripts = {production: {}, candidate: {DIVERGE_AT: safe_move(SEED)}}

    def scripted(checkpoint_id: str, model_dir: Path) -> PolicyClient:
        return ScriptedPolicy(checkpoint_id, model_dir, scripts[checkpoint_id], turns)

    governance = role_engine("governance")
    authorizer = build_authorizer(settings, "governance")
    world = make_world(owner_engine, governance, authorizer, threshold_name=uid("thr-"))
    promotion_id = uid("promo-")
    insert(owner_engine, "promotion", id=promotion_id, proposal_id=world.proposal_id,
           checkpoint_id=world.candidate, run_id=world.run_id, submitted_by=world.submitter,
           status="open")
    set_routing(owner_engine, "production", production, share=1.0)
    set_routing(owner_engine, "canary", None)
    set_routing(owner_engine, "shadow", candidate, share=1.0)
    with owner_engine.connect() as conn:
        since = conn.execute(text("SELECT now()")).scalar_one()

    queue = settings.model_copy(
        update={"task_queue_prefix": f"{settings.task_queue_prefix}{uuid.uuid4().hex[:6]}-"})
    client: Client = await connect(queue, identity="shadow-agreement-test", service="execution")
    async with build_worker(client, queue, policy_factory=scripted):
        result = await client.execute_workflow(
            ROLLOUT_WORKFLOW, request_batch(owner_engine, batch), id=f"rollout-{batch.batch_id}",
            task_queue=queue.task_queue(EXECUTION_QUEUE), result_type=RolloutBatchResult)
    assert sorted(result.shadow_trajectory_ids) == [f"{e}:shadow" for e in episode_ids]

    with owner_engine.connect() as conn:
        for episode in episode_ids:
            shadow = conn.execute(text(
                "SELECT action_text, feedback->'shadow_agreement' FROM step "
                "WHERE trajectory_id = :t ORDER BY index"), {"t": f"{episode}:shadow"}).all()
            played = conn.execute(text(
                "SELECT action_text FROM step WHERE trajectory_id = :t ORDER BY index"),
                {"t": episode}).scalars().all()
            # Multi-step on both sides, and after the divergence the text still matches
            # index by index: comparing raw text would count those steps as agreeing.
            assert len(shadow) == len(played) == MAX_TURNS
            assert [v["compared"] for _, v in shadow] == [True] * (DIVERGE_AT + 1) + [False] * (
                MAX_TURNS - DIVERGE_AT - 1)
            assert [v["agreed"] for _, v in shadow] == [True] * DIVERGE_AT + [False] * (
                MAX_TURNS - DIVERGE_AT)
            assert sum(a == b for (a, _), b in zip(shadow, played, strict=True)) == MAX_TURNS - 1

    outcome = EvidenceActivities(governance, authorizer).decide_shadow(ShadowInput(
        promotion_id=promotion_id, threshold_id=world.threshold_id,
        candidate_checkpoint_id=candidate, production_checkpoint_id=production,
        since=since.isoformat()))
    with owner_engine.connect() as conn:
        evidence = conn.execute(text(
            "SELECT evidence FROM gate_result WHERE id = :g"),
            {"g": outcome.gate_result_id}).scalar_one()
    assert evidence["paired_episodes"] == EPISODES
    assert evidence["steps_compared"] == EPISODES * (DIVERGE_AT + 1)
    assert evidence["steps_agreed"] == EPISODES * DIVERGE_AT
    assert evidence["agreement_rate"] == pytest.approx(DIVERGE_AT / (DIVERGE_AT + 1))
