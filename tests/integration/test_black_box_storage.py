"""A gateway session's calls stored as one token sequence and trained on as sampled.

Real PostgreSQL and OPA: the execution role writes two agent sessions (one keeps its
history, one compacts it once and runs a sub-agent) through ``write_trajectory``; the
learning role reads them back through its own views with the learner's reader, and the
learner's packing turns them into forward passes. The stored sequence is exactly the one
the session spliced together call by call, and the tokens the learner trains on are
exactly the ids the policy sampled in the main loop: none more, none fewer, in order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import pytest
from sqlalchemy import Engine, text
from transformers import PreTrainedTokenizerBase

from execution_loop.command_agent import episode_steps
from execution_loop.gateway.api_shapes import ChatMessage, ModelRequest
from execution_loop.gateway.session import AgentSession, Gateway, SessionSettings
from execution_loop.store import StepRow, TrajectoryRow, write_trajectory
from learning_loop.batch import build_training_samples
from learning_loop.sequences import pack_samples
from learning_loop.tiny_model import build_tokenizer
from learning_loop.trajectory_reader import load_rollout_data
from tests.factories import make_task, uid
from tests.gateway_standins import ScriptedPolicy
from triloop.config import Settings
from triloop.run_config import AdvantageConfig
from triloop.wiring import build_authorizer

pytestmark = pytest.mark.integration
OPENING = [ChatMessage("system", "You are a careful agent. " * 6),
           ChatMessage("user", "Add the numbers in data.txt using the python tool.")]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return build_tokenizer()


def play(tokenizer: PreTrainedTokenizerBase, calls: int, *, compact_at: int | None = None
         ) -> tuple[AgentSession, ScriptedPolicy]:
    """An agent session: tool results come back as ``tool`` messages; at ``compact_at`` the
    agent replaces its history with a summary and asks a sub-agent (not trained on)."""
    policy = ScriptedPolicy(tokenizer, [f"python: print({k} + {k})" for k in range(calls + 1)])
    session = Gateway().open_session(SessionSettings(
        policy=policy, temperature=1.0, seed=17, max_tokens_per_turn=48,
        max_total_tokens=100_000))

    def ask(messages: Sequence[ChatMessage], **headers: str) -> str:
        return session.complete(ModelRequest("chat.completions", "m", tuple(messages), None,
                                             None), headers).text

    messages = list(OPENING)
    for k in range(calls):
        if k == compact_at:
            messages = [*OPENING, ChatMessage("user", "So far: 0 + 0 = 0, 1 + 1 = 2.")]
            ask([ChatMessage("user", "Check 1 + 1 = 2.")], **{"x-triloop-agent": "checker"})
        messages += [ChatMessage("assistant", ask(messages)),
                     ChatMessage("tool", f"{k + k}")]
    return session, policy


def stored(session: AgentSession, row: TrajectoryRow) -> tuple[TrajectoryRow, list[StepRow]]:
    """The trajectory and step rows the rollout activity writes for this session."""
    steps = [StepRow(s.index, s.prompt_token_ids, s.action_token_ids, s.action_mask,
                     s.behaviour_logprobs, s.observation, s.action_text,
                     {**s.feedback, "finish_reason": s.finish_reason}, s.reward, s.done)
             for s in episode_steps(session, [])]
    return TrajectoryRow(**{**row.__dict__, "num_steps": len(steps)}), steps


def test_the_learner_trains_on_exactly_the_ids_the_gateway_sampled(
    tokenizer: PreTrainedTokenizerBase, settings: Settings, owner_engine: Engine,
    role_engine: Callable[[str], Engine],
) -> None:
    run_id, batch_id, task_id = uid("run-"), uid("bb-batch-"), make_task(owner_engine)
    sessions = [play(tokenizer, 12), play(tokenizer, 12, compact_at=7)]
    rows = []
    for number, ((session, _), reward) in enumerate(zip(sessions, (1.0, 0.0), strict=True)):
        rows.append(stored(session, TrajectoryRow(
            id=uid("bb-ep-"), batch_id=batch_id, task_id=task_id, checkpoint_id="scripted",
            purpose="training", group_id=f"{batch_id}:0", status="completed",
            sample_index=number, run_id=run_id, success=reward > 0, total_reward=reward)))
    plan = {row.id: {"task_id": task_id, "seed": 0} for row, _ in rows}
    with owner_engine.begin() as conn:
        conn.execute(text("INSERT INTO rollout_batch (id, purpose, requested_by, planned_episodes)"
                          " VALUES (:b, 'training', 'learning', CAST(:p AS jsonb))"),
                     {"b": batch_id, "p": json.dumps(plan)})
    execution = role_engine("execution")
    authorizer = build_authorizer(settings, "execution")
    for row, steps in rows:
        assert write_trajectory(engine=execution, authorizer=authorizer, trajectory=row,
                                steps=steps)

    # Stored: the session's own sequence, the opening once, one segment per rewrite.
    with execution.connect() as conn:
        sequences = {r.trajectory_id: r for r in conn.execute(text(
            "SELECT trajectory_id, token_ids, action_mask, behaviour_logprobs, segment_starts"
            " FROM trajectory_sequence WHERE trajectory_id = ANY(:ids)"),
            {"ids": [row.id for row, _ in rows]})}
    for (session, policy), (row, _) in zip(sessions, rows, strict=True):
        mine, kept = session.trajectory.sequence, sequences[row.id]
        assert kept.token_ids == mine.token_ids and kept.action_mask == mine.action_mask
        assert kept.behaviour_logprobs == mine.behaviour_logprobs
        assert kept.segment_starts == mine.segment_starts
        assert len(kept.token_ids) < sum(len(p) for p in policy.prompts) / 3
    assert [len(sequences[row.id].segment_starts) for row, _ in rows] == [1, 2]

    # Read by the learning role through its views, then packed for the forward passes.
    data = load_rollout_data(engine=role_engine("learning"), run_id=run_id,
                             batch_ids=[batch_id], task_environments={task_id: "agent"})
    samples, _ = build_training_samples(data.steps, AdvantageConfig())
    for (session, _), (row, _) in zip(sessions, rows, strict=True):
        main = session.main_calls()
        mine = [s for s in samples if s.trajectory_id == row.id]
        assert [list(s.prompt_token_ids) for s in mine] == [list(c.prompt_token_ids)
                                                            for c in main]
        assert [list(s.action_token_ids) for s in mine] == [c.completion_token_ids for c in main]
        assert [list(s.behaviour_logprobs) for s in mine] == [c.logprobs for c in main]
        packed = [p for p in pack_samples(mine) if p.trajectory_id == row.id]
        sampled = [t for c in main for t in c.completion_token_ids]
        trained = [t for p in packed for start, end in p.spans for t in p.token_ids[start:end]]
        assert trained == sampled  # trainable tokens are the sampled tokens, exactly
        assert sum(end - start for p in packed for start, end in p.spans) \
            == session.trajectory.sampled_tokens == len(sampled)
        # One forward pass per stored segment, over exactly the stored segment's tokens.
        kept = sequences[row.id]
        bounds = [*kept.segment_starts, len(kept.token_ids)]
        assert [list(p.token_ids) for p in packed] == [
            kept.token_ids[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    lengths = {r.trajectory_id: n for r, n in zip(data.returns, data.lengths, strict=True)}
    assert lengths == {row.id: session.trajectory.sampled_tokens
                       for (session, _), (row, _) in zip(sessions, rows, strict=True)}
