"""Run one episode: the environment and the policy take turns until the episode ends.

Each turn the harness renders the context (under the contract's context rule) as token
ids, the policy samples an action, its text goes to the environment, and a ``StepRecord``
keeps the prompt ids, the sampled ids, their mask and behaviour logprobs exactly as used.

How an episode ends:
- ``completed``: the environment said done.
- ``truncated``: a limit ended it first. ``failure_reason`` names the limit: ``max_turns``,
  ``max_total_tokens`` (tokens the policy generated in the episode), ``wall_time``
  (the contract's limit), ``deadline`` (the caller's, e.g. the batch's), ``context_length``
  (the prompt no longer fits the model), or whatever the environment reported in
  ``feedback["truncated"]`` when it ended the episode itself.
- ``failed``: the environment raised (other than an infrastructure error) or reported
  ``feedback["failure"]`` (e.g. ``sandbox_limit``); ``failure_reason`` says why, and no
  outcome is asked for (success is False, outcome reward 0).
Infrastructure errors (inference, sandbox, verifier, an unreachable environment service)
propagate so the caller can retry. Limits are checked between turns; a turn in progress
is never interrupted.

Tools: when the contract declares tools, a turn whose text holds a tool call is a call.
A valid one goes to the environment's ``call_tool(name, arguments)`` (or, for an
environment without it, to ``step`` as the call's canonical JSON); the step records
``feedback["tool_call"]`` and ``feedback["tool_result"]``. A malformed call, or one that
does not fit its schema, never reaches the environment: the step records
``feedback["tool_error"]`` and the model reads the error as its observation.

Hooks: the contract's lifecycle hooks (``execution_loop.hooks``) run before the reset,
after each step and before the verdict; a refusal ends the episode ``failed`` with the
hook's reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from execution_loop.environments.base import (
    Environment,
    EnvironmentUnavailable,
    Outcome,
    StepResult,
    reset_task,
)
from execution_loop.harness import ChatHarness, Turn
from execution_loop.hooks import EpisodeHooks, HookFailed
from execution_loop.inference.base import InferenceError, PolicyClient, PromptTooLongError
from execution_loop.sandbox import SandboxError
from execution_loop.tool_calls import ToolCallError, parse_tool_call
from execution_loop.verification import VerificationError
from triloop.contracts import ContextRule, Limits, ToolSpec
from triloop.statuses import EpisodeStatus
from triloop.token_sequence import step_action_mask

COMPLETED, TRUNCATED, FAILED = (EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED,
                                EpisodeStatus.FAILED)
INFRASTRUCTURE_ERRORS: tuple[type[Exception], ...] = (
    InferenceError,
    SandboxError,
    VerificationError,
    EnvironmentUnavailable,
)
_SEED_STRIDE = 1_000_003  # > any max_turns, so (seed, turn) pairs never share a turn seed


@dataclass(frozen=True)
class StepRecord:
    """One turn as it happened."""

    index: int
    # Exactly what the policy was fed (a gateway call's: a view into its session's sequence).
    prompt_token_ids: Sequence[int]
    action_token_ids: list[int]  # exactly what it sampled (its end-of-turn token included)
    action_mask: Sequence[int]  # over prompt + action: 1 on the action's ids only
    behaviour_logprobs: list[float]  # one per action token, at the sampling temperature
    observation: str  # the environment's reply to this action
    action_text: str  # the action ids decoded without special tokens, as sent to env.step
    reward: float  # the environment's process reward for this step
    done: bool
    feedback: dict[str, Any]
    finish_reason: str  # "stop" (the model ended its turn) or "length" (token cap)


@dataclass(frozen=True)
class EpisodeRecord:
    """A finished episode."""

    status: str  # completed | truncated | failed
    failure_reason: str | None  # the limit or the error; None when completed
    steps: list[StepRecord]
    total_reward: float  # sum of step rewards + the outcome reward
    success: bool
    outcome_details: dict[str, Any]
    outcome_reward: float = 0.0
    initial_observation: str = ""
    checkpoint_id: str = ""
    seed: int = 0
    task_seed: int = 0
    generated_tokens: int = 0
    wall_time_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class ReplayDiverged(Exception):
    """Replaying a cut episode's actions did not give back its stored observations.

    Partial rollouts rely on environments being deterministic given the seed and the
    actions; one that is not cannot be continued (the episode fails, visibly).
    """


def replay(env: Environment, steps: Sequence[StepRecord], tools: list[ToolSpec]) -> None:
    """Bring a freshly reset ``env`` to where ``steps`` left it, checking each turn."""
    for step in steps:
        result = act(env, step.action_text, tools)
        if result.observation != step.observation or result.done != step.done:
            raise ReplayDiverged(
                f"replaying turn {step.index} gave a different observation than the one"
                " stored: the environment is not deterministic given seed and actions")


def episode_limits(contract_limits: Limits, max_turns: int | None,
                   max_new_tokens: int | None = None) -> Limits:
    """The contract's limits, with the caller's turn and per-turn token limits where they are
    lower (a training run's ``rollout.max_turns`` or horizon curriculum, and its
    ``rollout.max_new_tokens``); a caller never raises a contract's limit."""
    lower: dict[str, int] = {}
    if max_turns is not None and max_turns < contract_limits.max_turns:
        lower["max_turns"] = max_turns
    if max_new_tokens is not None and max_new_tokens < contract_limits.max_tokens_per_turn:
        lower["max_tokens_per_turn"] = max_new_tokens
    return contract_limits.model_copy(update=lower) if lower else contract_limits


def turn_seed(seed: int, index: int) -> int:
    """The sampling seed of turn ``index``: distinct per turn, reproducible per episode."""
    return (seed * _SEED_STRIDE + index) % 2**63


def _reason(exc: Exception) -> str:
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        return reason
    return f"{type(exc).__name__}: {exc}"[:500]


def contract_tools(env: Environment) -> list[ToolSpec]:
    """The tools the environment's contract declares (none for a bare test double)."""
    tools = getattr(getattr(env, "contract", None), "tools", None)
    return list(tools) if tools else []


def act(env: Environment, text: str, tools: list[ToolSpec]) -> StepResult:
    """One turn: a tool call when the text holds one and tools are declared, else a step."""
    if not tools:
        return env.step(text)
    try:
        call = parse_tool_call(text, tools)
    except ToolCallError as exc:
        return StepResult(f"tool call error: {exc}", 0.0, False, {"tool_error": str(exc)})
    if call is None:
        return env.step(text)
    call_tool = getattr(env, "call_tool", None)
    result: StepResult = (
        call_tool(call.name, call.arguments) if callable(call_tool) else env.step(call.as_action())
    )
    feedback = {**result.feedback, "tool_call": call.as_json(), "tool_result": result.observation}
    return StepResult(result.observation, result.reward, result.done, feedback)


def run_episode(
    env: Environment,
    policy: PolicyClient,
    *,
    seed: int,
    task_seed: int,
    limits: Limits,
    context_rule: ContextRule,
    task_item: Mapping[str, Any] | None = None,
    on_step: Callable[[StepRecord], None] | None = None,
    deadline: float | None = None,
    system_prompt: str | None = None,
    temperature: float = 1.0,
    harness: ChatHarness | None = None,
    clock: Callable[[], float] = time.time,
    resume: Sequence[StepRecord] = (),
) -> EpisodeRecord:
    """Play one episode of ``env`` with ``policy``; ``deadline`` is a ``clock()`` time.

    ``resume``: the turns of a cut episode to continue (partial rollouts). They are
    replayed on the reset environment (their actions, not resampled; lifecycle hooks ran
    when they were first played), kept as they were, and the policy plays on from there.
    ``ReplayDiverged`` propagates when the environment answers differently.
    """
    started = clock()
    wall_deadline = started + limits.wall_time_s
    tools = contract_tools(env)
    harness = harness or ChatHarness(policy.tokenizer(), tools=tools)
    steps: list[StepRecord] = []
    turns: list[Turn] = []
    generated = 0
    status: str = TRUNCATED
    reason: str | None = "max_turns"

    def record(
        final_status: str, final_reason: str | None, initial: str, outcome: Outcome | None
    ) -> EpisodeRecord:
        step_rewards = sum(s.reward for s in steps)
        outcome_reward = outcome.reward if outcome is not None else 0.0
        return EpisodeRecord(
            status=final_status,
            failure_reason=final_reason,
            steps=steps,
            total_reward=step_rewards + outcome_reward,
            success=bool(outcome.success) if outcome is not None else False,
            outcome_details=dict(outcome.details) if outcome is not None else {},
            outcome_reward=outcome_reward,
            initial_observation=initial,
            checkpoint_id=policy.checkpoint_id,
            seed=seed,
            task_seed=task_seed,
            generated_tokens=generated,
            wall_time_s=clock() - started,
        )

    hooks = EpisodeHooks.of(getattr(env, "contract", None))
    try:
        hooks.run_before_reset(task_seed)
        initial = reset_task(env, task_seed, task_item)
    except HookFailed as refused:
        return record(FAILED, refused.reason, "", None)
    except INFRASTRUCTURE_ERRORS:
        raise
    except Exception as exc:  # the environment's own fault: record it, keep the batch going
        return record(FAILED, _reason(exc), "", None)
    if resume:
        replay(env, resume, tools)
        for prior in resume:
            steps.append(prior)
            turns.append(Turn(action_token_ids=list(prior.action_token_ids),
                              observation=prior.observation))
            generated += len(prior.action_token_ids)

    while True:
        if len(steps) >= limits.max_turns:
            status, reason = TRUNCATED, "max_turns"
            break
        now = clock()
        if deadline is not None and now >= deadline:
            status, reason = TRUNCATED, "deadline"
            break
        if now >= wall_deadline:
            status, reason = TRUNCATED, "wall_time"
            break
        budget = min(limits.max_tokens_per_turn, limits.max_total_tokens - generated)
        if budget <= 0:
            status, reason = TRUNCATED, "max_total_tokens"
            break
        prompt = harness.prompt_token_ids(
            system=system_prompt,
            initial_observation=initial,
            turns=turns,
            keep_last_turns=context_rule.keep_last_turns,
        )
        try:
            generation = policy.generate(
                prompt,
                max_new_tokens=budget,
                temperature=temperature,
                seed=turn_seed(seed, len(steps)),
            )
        except PromptTooLongError:
            status, reason = TRUNCATED, "context_length"
            break
        generated += len(generation.token_ids)
        try:
            result = act(env, generation.text, tools)
        except INFRASTRUCTURE_ERRORS:
            raise
        except Exception as exc:  # the environment's own fault: record it
            status, reason = FAILED, _reason(exc)
            break
        refusal: str | None = None
        try:
            notes = hooks.run_after_step(len(steps), generation.text, result)
        except HookFailed as refused:
            notes, refusal = {}, refused.reason
        if notes or refusal:
            extra = {"hooks": notes} if notes else {}
            result = StepResult(
                result.observation,
                result.reward,
                result.done or bool(refusal),
                {**result.feedback, **extra, **({"failure": refusal} if refusal else {})},
            )
        step = StepRecord(
            index=len(steps),
            prompt_token_ids=prompt,
            action_token_ids=list(generation.token_ids),
            action_mask=step_action_mask(len(prompt), len(generation.token_ids)),
            behaviour_logprobs=list(generation.logprobs),
            observation=result.observation,
            action_text=generation.text,
            reward=float(result.reward),
            done=result.done,
            feedback=dict(result.feedback),
            finish_reason=generation.finish_reason,
        )
        steps.append(step)
        turns.append(Turn(action_token_ids=step.action_token_ids, observation=result.observation))
        if on_step is not None:
            on_step(step)
        if result.done:
            failure = result.feedback.get("failure")
            truncated = result.feedback.get("truncated")
            if isinstance(failure, str) and failure:
                status, reason = FAILED, failure
            elif isinstance(truncated, str) and truncated:
                status, reason = TRUNCATED, truncated
            else:
                status, reason = COMPLETED, None
            break

    if status == FAILED:  # no verdict on an episode the environment could not carry out
        return record(status, reason, initial, None)
    summary = {
        "status": status,
        "failure_reason": reason,
        "steps": len(steps),
        "actions": [s.action_text for s in steps],
    }
    try:
        episode_notes = hooks.run_after_episode(summary)
    except HookFailed as refused:
        return record(FAILED, refused.reason, initial, None)
    try:
        outcome = env.outcome()
        if episode_notes:
            outcome = Outcome(
                outcome.success, outcome.reward, {**outcome.details, "hooks": episode_notes}
            )
    except INFRASTRUCTURE_ERRORS:
        raise
    except Exception as exc:
        return record(FAILED, f"outcome: {_reason(exc)}", initial, None)
    return record(status, reason, initial, outcome)
