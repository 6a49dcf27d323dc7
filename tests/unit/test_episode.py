"""The episode runner with the tiny model and a fake environment (a collaborator here)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from execution_loop.environments.base import Outcome, StepResult
from execution_loop.episode import (
    COMPLETED,
    FAILED,
    TRUNCATED,
    ReplayDiverged,
    StepRecord,
    run_episode,
    turn_seed,
)
from execution_loop.harness import ChatHarness, Turn
from execution_loop.inference.base import Generation, InferenceError, PromptTooLongError
from execution_loop.inference.torch_backend import TorchPolicyClient
from execution_loop.sandbox import SandboxError
from learning_loop.tiny_model import create_tiny_model
from triloop.contracts import ContextRule, Limits

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)


class FakeEnvironment:
    """Counts turns; done after ``done_after`` turns, or raises/reports when told to."""

    def __init__(
        self,
        *,
        done_after: int | None = None,
        raise_on_step: Exception | None = None,
        final_feedback: dict[str, Any] | None = None,
    ) -> None:
        self.contract: Any = None
        self.done_after = done_after
        self.raise_on_step = raise_on_step
        self.final_feedback = final_feedback or {}
        self.actions: list[str] = []
        self.reset_seed: int | None = None

    def reset(self, seed: int, item: Any = None) -> str:
        self.reset_seed, self.actions = seed, []
        return f"Map for seed {seed}: S F G"

    def step(self, action: str) -> StepResult:
        if self.raise_on_step is not None:
            raise self.raise_on_step
        self.actions.append(action)
        done = self.done_after is not None and len(self.actions) >= self.done_after
        feedback = {"turn": len(self.actions), **(self.final_feedback if done else {})}
        return StepResult(f"turn {len(self.actions)} done", 0.25, done, feedback)

    def outcome(self) -> Outcome:
        reached = self.done_after is not None and len(self.actions) >= self.done_after
        return Outcome(reached, 1.0 if reached else 0.0, {"turns": len(self.actions)})

    def state_fingerprint(self) -> str:
        return str(len(self.actions))

    def close(self) -> None:
        pass


class RaisingPolicy:
    """Wraps a policy and raises on the given turn."""

    def __init__(self, inner: TorchPolicyClient, error: Exception, on_call: int = 0) -> None:
        self.inner, self.error, self.on_call, self.calls = inner, error, on_call, 0
        self.checkpoint_id = inner.checkpoint_id

    def generate(
        self,
        prompt_token_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        seed: int | None,
        stop_token_ids: Sequence[int] = (),
    ) -> Generation:
        self.calls += 1
        if self.calls > self.on_call:
            raise self.error
        return self.inner.generate(
            prompt_token_ids, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed
        )

    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.inner.tokenizer()


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> TorchPolicyClient:
    model_dir = create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
    return TorchPolicyClient(model_dir, device="cpu", checkpoint_id="ckpt-0")


def limits(**overrides: Any) -> Limits:
    values: dict[str, Any] = {
        "max_turns": 6,
        "wall_time_s": 600.0,
        "max_tokens_per_turn": 8,
        "max_total_tokens": 1000,
    }
    return Limits(**{**values, **overrides})


def test_episode_completes_when_the_environment_is_done(policy: TorchPolicyClient) -> None:
    env = FakeEnvironment(done_after=3)
    seen: list[StepRecord] = []
    record = run_episode(
        env,
        policy,
        seed=1,
        task_seed=42,
        limits=limits(),
        context_rule=ContextRule(),
        on_step=seen.append,
    )
    assert record.status == COMPLETED and record.failure_reason is None
    assert env.reset_seed == 42 and record.initial_observation == "Map for seed 42: S F G"
    assert len(record.steps) == 3 and seen == record.steps
    assert record.success and record.outcome_details == {"turns": 3}
    assert record.total_reward == pytest.approx(3 * 0.25 + 1.0)
    assert record.checkpoint_id == "ckpt-0"
    for index, step in enumerate(record.steps):
        assert step.index == index
        assert len(step.action_mask) == len(step.prompt_token_ids) + len(step.action_token_ids)
        assert step.action_mask == [0] * len(step.prompt_token_ids) + [1] * len(
            step.action_token_ids
        )
        assert len(step.behaviour_logprobs) == len(step.action_token_ids) <= 8
        assert env.actions[index] == step.action_text
        assert step.observation == f"turn {index + 1} done"
    assert record.generated_tokens == sum(len(s.action_token_ids) for s in record.steps)


def test_prompts_are_the_harness_rendering_of_stored_ids(policy: TorchPolicyClient) -> None:
    record = run_episode(
        FakeEnvironment(done_after=3),
        policy,
        seed=2,
        task_seed=0,
        limits=limits(),
        context_rule=ContextRule(keep_last_turns=1),
        system_prompt="Play.",
    )
    harness = ChatHarness(policy.tokenizer())
    turns = [Turn(s.action_token_ids, s.observation) for s in record.steps]
    for step in record.steps:
        expected = harness.prompt_token_ids(
            system="Play.",
            initial_observation=record.initial_observation,
            turns=turns[: step.index],
            keep_last_turns=1,
        )
        assert step.prompt_token_ids == expected
    # the context rule dropped turn 0 from the prompt of turn 2
    assert "turn 1 done" not in policy.tokenizer().decode(record.steps[2].prompt_token_ids)


def test_same_seeds_give_the_same_episode(policy: TorchPolicyClient) -> None:
    def play(seed: int) -> list[list[int]]:
        record = run_episode(
            FakeEnvironment(done_after=2),
            policy,
            seed=seed,
            task_seed=7,
            limits=limits(),
            context_rule=ContextRule(),
        )
        return [s.action_token_ids for s in record.steps]

    assert play(3) == play(3)
    assert play(3) != play(4)
    assert turn_seed(3, 0) != turn_seed(3, 1)


def test_max_turns_truncates(policy: TorchPolicyClient) -> None:
    record = run_episode(
        FakeEnvironment(),
        policy,
        seed=0,
        task_seed=0,
        limits=limits(max_turns=2),
        context_rule=ContextRule(),
    )
    assert record.status == TRUNCATED and record.failure_reason == "max_turns"
    assert len(record.steps) == 2 and not record.success


def test_deadline_truncates_between_turns(policy: TorchPolicyClient) -> None:
    now = [100.0]

    def clock() -> float:
        return now[0]

    def advance(_: StepRecord) -> None:
        now[0] += 10.0

    record = run_episode(
        FakeEnvironment(),
        policy,
        seed=0,
        task_seed=0,
        limits=limits(),
        context_rule=ContextRule(),
        on_step=advance,
        deadline=125.0,
        clock=clock,
    )
    assert record.status == TRUNCATED and record.failure_reason == "deadline"
    assert len(record.steps) == 3
    past = run_episode(
        FakeEnvironment(),
        policy,
        seed=0,
        task_seed=0,
        limits=limits(),
        context_rule=ContextRule(),
        deadline=50.0,
        clock=clock,
    )
    assert past.status == TRUNCATED and past.steps == [] and past.failure_reason == "deadline"


def test_contract_wall_time_truncates(policy: TorchPolicyClient) -> None:
    now = [0.0]

    def advance(_: StepRecord) -> None:
        now[0] += 1.0

    record = run_episode(
        FakeEnvironment(),
        policy,
        seed=0,
        task_seed=0,
        limits=limits(wall_time_s=2.0),
        context_rule=ContextRule(),
        on_step=advance,
        clock=lambda: now[0],
    )
    assert (record.status, record.failure_reason, len(record.steps)) == (TRUNCATED, "wall_time", 2)


def test_total_token_budget_truncates_and_caps_the_last_turn(policy: TorchPolicyClient) -> None:
    record = run_episode(
        FakeEnvironment(),
        policy,
        seed=0,
        task_seed=0,
        limits=limits(max_tokens_per_turn=8, max_total_tokens=12),
        context_rule=ContextRule(),
    )
    assert record.status == TRUNCATED and record.failure_reason == "max_total_tokens"
    # 8 tokens, then the 4 left in the budget (the random model never ends a turn early here)
    assert [len(s.action_token_ids) for s in record.steps] == [8, 4]
    assert record.generated_tokens == 12


def test_prompt_too_long_truncates_as_context_length(policy: TorchPolicyClient) -> None:
    failing = RaisingPolicy(policy, PromptTooLongError("too long"), on_call=1)
    record = run_episode(
        FakeEnvironment(),
        failing,
        seed=0,
        task_seed=0,
        limits=limits(),
        context_rule=ContextRule(),
    )
    assert (record.status, record.failure_reason, len(record.steps)) == (
        TRUNCATED,
        "context_length",
        1,
    )


def test_environment_errors_fail_the_episode_and_infrastructure_errors_propagate(
    policy: TorchPolicyClient,
) -> None:
    record = run_episode(
        FakeEnvironment(raise_on_step=RuntimeError("board on fire")),
        policy,
        seed=0,
        task_seed=0,
        limits=limits(),
        context_rule=ContextRule(),
    )
    assert record.status == FAILED and record.failure_reason == "RuntimeError: board on fire"
    assert not record.success and record.steps == []
    with pytest.raises(SandboxError):
        run_episode(
            FakeEnvironment(raise_on_step=SandboxError("cannot fork")),
            policy,
            seed=0,
            task_seed=0,
            limits=limits(),
            context_rule=ContextRule(),
        )
    with pytest.raises(InferenceError):
        run_episode(
            FakeEnvironment(),
            RaisingPolicy(policy, InferenceError("server down")),
            seed=0,
            task_seed=0,
            limits=limits(),
            context_rule=ContextRule(),
        )


@pytest.mark.parametrize(
    ("feedback", "status", "reason", "success"),
    [
        ({"failure": "sandbox_limit"}, FAILED, "sandbox_limit", False),
        ({"truncated": "max_turns"}, TRUNCATED, "max_turns", True),
        ({"truncated": None}, COMPLETED, None, True),
    ],
)
def test_environment_reports_how_it_ended(
    policy: TorchPolicyClient,
    feedback: dict[str, Any],
    status: str,
    reason: str | None,
    success: bool,
) -> None:
    record = run_episode(
        FakeEnvironment(done_after=1, final_feedback=feedback),
        policy,
        seed=0,
        task_seed=0,
        limits=limits(),
        context_rule=ContextRule(),
    )
    assert (record.status, record.failure_reason, record.success) == (status, reason, success)


def test_a_cut_episode_resumes_by_replaying_its_actions(policy: TorchPolicyClient) -> None:
    """Partial rollouts: the prior turns are replayed on a reset env, kept, and play goes on."""
    now = [100.0]

    def advance(_: StepRecord) -> None:
        now[0] += 10.0

    cut = run_episode(FakeEnvironment(done_after=4), policy, seed=5, task_seed=9,
                      limits=limits(), context_rule=ContextRule(), on_step=advance,
                      deadline=115.0, clock=lambda: now[0])
    assert cut.status == TRUNCATED and cut.failure_reason == "deadline" and len(cut.steps) == 2

    env = FakeEnvironment(done_after=4)
    resumed = run_episode(env, policy, seed=6, task_seed=9, limits=limits(),
                          context_rule=ContextRule(), resume=cut.steps)
    assert resumed.status == COMPLETED and len(resumed.steps) == 4
    assert resumed.steps[:2] == cut.steps  # kept exactly as first sampled
    assert env.reset_seed == 9 and env.actions[:2] == [s.action_text for s in cut.steps]
    harness = ChatHarness(policy.tokenizer())
    turns = [Turn(s.action_token_ids, s.observation) for s in resumed.steps]
    assert resumed.steps[2].prompt_token_ids == harness.prompt_token_ids(
        system=None, initial_observation=resumed.initial_observation, turns=turns[:2],
        keep_last_turns=ContextRule().keep_last_turns)
    assert resumed.generated_tokens == sum(len(s.action_token_ids) for s in resumed.steps)
    # The horizon counts the replayed turns: a limit of 3 allows one more.
    capped = run_episode(FakeEnvironment(), policy, seed=6, task_seed=9,
                         limits=limits(max_turns=3), context_rule=ContextRule(),
                         resume=cut.steps)
    assert capped.failure_reason == "max_turns" and len(capped.steps) == 3


def test_a_replay_that_diverges_is_refused(policy: TorchPolicyClient) -> None:
    class Drifting(FakeEnvironment):
        def step(self, action: str) -> StepResult:
            result = super().step(action)
            return StepResult(result.observation + " (drifted)", result.reward, result.done,
                              result.feedback)

    cut = run_episode(FakeEnvironment(), policy, seed=5, task_seed=9,
                      limits=limits(max_turns=2), context_rule=ContextRule())
    with pytest.raises(ReplayDiverged):
        run_episode(Drifting(), policy, seed=6, task_seed=9, limits=limits(),
                    context_rule=ContextRule(), resume=cut.steps)
