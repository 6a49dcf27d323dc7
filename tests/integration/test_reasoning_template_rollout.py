"""A reasoning chat template through the real execution worker, then scored by the learner.

The model is the tiny one with Qwen3's template and thinking off (``tests.chat_templates``):
every generation prompt holds an empty think block that the history never shows, so no
turn's prompt extends the one before. A training batch on real Temporal, PostgreSQL and OPA
stores each episode; each stored prompt must be the template's own rendering of the
history (as text: the earlier actions in it are their sampled ids), each turn its own
segment, and the learner's logprobs of the stored sampled ids must equal the behaviour
logprobs the worker recorded.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch
from sqlalchemy import Engine
from sqlmodel import Session, select
from temporalio.client import Client
from transformers import AutoModelForCausalLM, AutoTokenizer

from execution_loop.store import load_turn_tokens
from execution_loop.worker import build_worker
from learning_loop.batch import TrainingSample
from learning_loop.objective import policy_action_logprobs
from tests.chat_templates import NO_THINKING_TEMPLATE, create_qwen3_style_model
from tests.factories_execution import make_builtin_task, register_checkpoint_dir, request_batch
from triloop.config import Settings
from triloop.db import engine_for_url
from triloop.models import Step, Trajectory, TrajectorySequence
from triloop.temporal import connect
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    ROLLOUT_WORKFLOW,
    RolloutBatchInput,
    RolloutBatchResult,
    RolloutItem,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GENERATION_PROMPT = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def reasoning_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_qwen3_style_model(tmp_path_factory.mktemp("qwen3-style") / "model",
                                    template=NO_THINKING_TEMPLATE)


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[Client]:
    yield await connect(settings, identity="reasoning-template-test", service="execution")


async def test_a_reasoning_template_s_episodes_are_stored_and_scored_as_sampled(
    client: Client, settings: Settings, owner_engine: Engine, reasoning_model: Path,
) -> None:
    checkpoint = register_checkpoint_dir(owner_engine, reasoning_model)
    task = make_builtin_task(owner_engine, "tool_arithmetic", seed=31)
    batch = RolloutBatchInput(
        batch_id=f"b{uuid.uuid4().hex[:10]}", purpose="training",
        items=[RolloutItem(task, 31, group_size=2)], checkpoint_id=checkpoint,
        max_concurrency=2, deadline_s=300, max_turns=3, max_new_tokens=6)
    queued = settings.model_copy(
        update={"task_queue_prefix": f"{settings.task_queue_prefix}{uuid.uuid4().hex[:6]}-"})
    async with build_worker(client, queued):
        result = await client.execute_workflow(
            ROLLOUT_WORKFLOW, request_batch(engine_for_url(settings.owner_url()), batch),
            id=f"rollout-{batch.batch_id}", task_queue=queued.task_queue(EXECUTION_QUEUE),
            result_type=RolloutBatchResult)
    assert result.failed == 0 and len(result.trajectory_ids) == 2

    tokenizer = AutoTokenizer.from_pretrained(reasoning_model)
    samples: list[TrainingSample] = []
    with Session(owner_engine) as session:
        for trajectory_id in result.trajectory_ids:
            row = session.get(Trajectory, trajectory_id)
            sequence = session.get(TrajectorySequence, trajectory_id)
            assert row is not None and sequence is not None
            steps = session.exec(select(Step).where(Step.trajectory_id == trajectory_id)
                                 .order_by(Step.index)).all()  # type: ignore[arg-type]
            turns = load_turn_tokens(session=session, trajectory_id=trajectory_id)
            assert len(turns) == row.num_steps >= 2
            # every turn opened a segment: its history no longer holds the empty think block
            assert len(sequence.segment_starts) == len(turns)
            first = str(tokenizer.decode(turns[0].prompt_token_ids))
            initial = first.removeprefix("<|im_start|>user\n").removesuffix(
                "<|im_end|>\n" + GENERATION_PROMPT)
            assert hashlib.sha256(initial.encode()).hexdigest() == (
                row.outcome["initial_observation_sha256"])
            history = [{"role": "user", "content": initial}]
            for step, turn in zip(steps, turns, strict=True):
                # The template's text exactly; the earlier actions in it are their sampled ids
                # (never re-tokenized), which a random model often spells unlike the tokenizer.
                assert tokenizer.decode(turn.prompt_token_ids) == tokenizer.apply_chat_template(
                    history, add_generation_prompt=True, tokenize=False)
                # The prompt splices the sampled ids, special tokens kept (a random model may
                # sample <|unk|>), while ``action_text`` is what a chat client holds of them,
                # specials dropped: rebuild from the ids. A closing <|im_end|> is the footer's.
                sampled = list(turn.action_token_ids)
                if sampled and sampled[-1] == tokenizer.eos_token_id:
                    sampled.pop()
                assert step.action_text == tokenizer.decode(sampled, skip_special_tokens=True)
                content = str(tokenizer.decode(sampled, skip_special_tokens=False))
                history += [{"role": "assistant", "content": content},
                            {"role": "user", "content": step.observation}]
                samples.append(TrainingSample(
                    trajectory_id, row.group_id, task, 0, tuple(turn.prompt_token_ids),
                    tuple(turn.action_token_ids), tuple(turn.behaviour_logprobs), 1.0))

    model = AutoModelForCausalLM.from_pretrained(reasoning_model, dtype=torch.float32).eval()
    rescored = policy_action_logprobs(model, samples, device=torch.device("cpu"))
    for sample, got in zip(samples, rescored, strict=True):
        assert torch.allclose(torch.tensor(got), torch.tensor(sample.behaviour_logprobs),
                              atol=1e-4, rtol=0)
