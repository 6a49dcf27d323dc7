"""The command harness: a black-box agent program plays one episode through the gateway.

The contract's ``agent`` section names a program (``agent.command``; ``{python}`` is the
worker's interpreter) and the fixture files copied into its fresh work directory. The
program runs in the sandbox with the task's initial observation on stdin and these
variables (nothing else is inherited):

- ``OPENAI_BASE_URL`` (``<gateway>/s/<session>/v1``), ``ANTHROPIC_BASE_URL``
  (``<gateway>/s/<session>``) and ``TRILOOP_GATEWAY_URL``: the model, behind the
  gateway; the session id in the path is the episode's, and the API keys are set to it
  too (clients insist on one);
- ``TRILOOP_ENV_URL``: the episode's environment, ``POST .../step {"action": text}``
  answering ``observation``, ``reward``, ``done`` (and ``GET .../observation``).

In the bubblewrap sandbox (no network) these URLs still work: the gateway, and only
the gateway, answers on the same ``127.0.0.1`` port inside, through a relay
(``sandboxes.reaching_loopback``); every other host service stays unreachable.

The gateway records every model call; the main loop's calls become the episode's steps
(prompt ids as fed, sampled ids, mask 1 on exactly the sampled ids, behaviour logprobs),
so the learner trains on them unchanged. Environment rewards go to the main-loop call
that preceded them. How an episode ends, in order: the environment said done (completed,
or what its feedback says); the environment failed (failed); the agent used its turns,
its tokens or its time (truncated: ``max_turns``, ``max_total_tokens``, ``wall_time``,
``deadline``, or the sandbox limit); the agent exited with a non-zero code without
finishing (failed: ``agent_failed (exit N): <its stderr's tail>``: a program that crashes,
on import or later, is broken, not cut short, and its traceback says why); the agent
exited with code 0 without finishing (truncated: ``agent_exited``). Inference, sandbox and
verifier failures propagate so the activity retries.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from execution_loop.environments.base import Environment, Outcome, reset_task
from execution_loop.episode import (
    COMPLETED,
    FAILED,
    INFRASTRUCTURE_ERRORS,
    TRUNCATED,
    EpisodeRecord,
    StepRecord,
    _reason,
)
from execution_loop.gateway.http_server import GatewayServer
from execution_loop.gateway.session import (
    AgentSession,
    CallRecord,
    Gateway,
    GatewayError,
    SessionSettings,
)
from execution_loop.inference.base import PolicyClient
from execution_loop.sandbox import SandboxBackend, SandboxLimits, SandboxResult
from execution_loop.sandboxes import describe, python_dependencies, reaching_loopback
from triloop.contracts import AgentSpec, EnvironmentContract, Limits
from triloop.token_sequence import step_action_mask

PYTHON_PLACEHOLDER = "{python}"
_STDERR_KEPT = 2000
_STDERR_IN_REASON = 400  # the failure reason's share of it: the traceback's last lines


@dataclass(frozen=True)
class EnvironmentStep:
    """One action the agent sent to the environment, and its reply."""

    action: str
    observation: str
    reward: float
    done: bool
    feedback: dict[str, Any]
    main_calls_before: int  # main-loop model calls made before this action


@dataclass
class EpisodeEnvironment:
    """The environment as the agent reaches it through the gateway, under the limits."""

    env: Environment
    initial: str
    max_turns: int
    ends_at: float  # clock() time after which steps are refused
    ends_because: str  # wall_time | deadline
    main_calls: Callable[[], int]
    clock: Callable[[], float] = time.time
    steps: list[EnvironmentStep] = field(default_factory=list)
    end: tuple[str, str | None] | None = None  # (status, reason) once the episode is over
    infrastructure_error: Exception | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def initial_observation(self) -> str:
        """The task as the agent first sees it."""
        return self.initial

    def cancel(self, reason: str) -> None:
        """Refuse every later action (the episode will not be stored as played)."""
        with self._lock:
            if self.end is None:
                self.end = (TRUNCATED, reason)

    def step(self, action: str) -> dict[str, Any]:
        """Apply one action, unless a limit or an earlier end refuses it."""
        with self._lock:
            if self.end is not None:
                raise GatewayError(409, f"the episode is over ({self.end[1] or self.end[0]})",
                                   code="episode_over")
            limit = ("max_turns" if len(self.steps) >= self.max_turns
                     else self.ends_because if self.clock() >= self.ends_at else None)
            if limit is not None:
                self.end = (TRUNCATED, limit)
                return {"observation": "", "reward": 0.0, "done": True, "truncated": limit}
            try:
                result = self.env.step(action)
            except INFRASTRUCTURE_ERRORS as exc:
                self.infrastructure_error = exc
                self.end = (FAILED, _reason(exc))
                raise GatewayError(502, f"the environment's infrastructure failed: {exc}",
                                   kind="api_error") from exc
            except Exception as exc:  # the environment's own fault: the episode fails
                self.end = (FAILED, _reason(exc))
                raise GatewayError(500, f"the environment failed: {_reason(exc)}",
                                   kind="api_error") from exc
            feedback = dict(result.feedback)
            self.steps.append(EnvironmentStep(action, result.observation, float(result.reward),
                                              result.done, feedback, self.main_calls()))
            if result.done:
                failure, truncated = feedback.get("failure"), feedback.get("truncated")
                if isinstance(failure, str) and failure:
                    self.end = (FAILED, failure)
                elif isinstance(truncated, str) and truncated:
                    self.end = (TRUNCATED, truncated)
                else:
                    self.end = (COMPLETED, None)
            return {"observation": result.observation, "reward": float(result.reward),
                    "done": result.done, "feedback": feedback}


def agent_argv(agent: AgentSpec, python: str = sys.executable) -> list[str]:
    """The command with ``{python}`` replaced by the worker's interpreter."""
    return [python if part == PYTHON_PLACEHOLDER else part for part in agent.command]


def prepare_workdir(agent: AgentSpec, contract: EnvironmentContract, into: Path) -> None:
    """Copy the agent's fixture files (or folders) into its work directory.

    The contract's validation made sure each is a listed fixture or lies under one.
    """
    if agent.files and contract.source_dir is None:
        raise ValueError("the contract was not loaded from a folder: its agent files are unknown")
    for relative in agent.files:
        source = (contract.source_dir or Path()) / relative
        target = into / Path(relative).name
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)


def agent_environment(base_url: str, session_id: str) -> dict[str, str]:
    """The variables that point the agent at the gateway and its environment."""
    return {
        "OPENAI_BASE_URL": f"{base_url}/v1", "OPENAI_API_KEY": session_id,
        "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": session_id,
        "TRILOOP_GATEWAY_URL": base_url, "TRILOOP_SESSION_ID": session_id,
        "TRILOOP_ENV_URL": f"{base_url}/env",
    }


def run_command_episode(
    env: Environment,
    policy: PolicyClient,
    *,
    contract: EnvironmentContract,
    sandbox: SandboxBackend,
    seed: int,
    task_seed: int,
    limits: Limits,
    task_item: Mapping[str, Any] | None = None,
    temperature: float = 1.0,
    deadline: float | None = None,
    on_progress: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.time,
    python: str = sys.executable,
) -> EpisodeRecord:
    """Play one episode with the contract's agent program; ``deadline`` is a ``clock()`` time."""
    agent = contract.agent
    if agent is None:
        raise ValueError(f"contract {contract.task!r} names no agent program")
    started = clock()
    try:
        initial = reset_task(env, task_seed, task_item)
    except INFRASTRUCTURE_ERRORS:
        raise
    except Exception as exc:  # the environment's own fault
        return EpisodeRecord(FAILED, _reason(exc), [], 0.0, False, {},
                             checkpoint_id=policy.checkpoint_id, seed=seed, task_seed=task_seed)
    gateway = Gateway()
    session = gateway.open_session(SessionSettings(
        policy=policy, temperature=temperature, seed=seed,
        max_tokens_per_turn=limits.max_tokens_per_turn, max_total_tokens=limits.max_total_tokens))
    wall_end = started + limits.wall_time_s
    ends_at, because = ((deadline, "deadline") if deadline is not None and deadline < wall_end
                        else (wall_end, "wall_time"))
    port = EpisodeEnvironment(env=env, initial=initial, max_turns=limits.max_turns,
                              ends_at=ends_at, ends_because=because, clock=clock,
                              main_calls=lambda: len(session.main_calls()))
    sandbox_limits = SandboxLimits(
        cpu_time_s=agent.cpu_time_s, memory_bytes=agent.memory_mb * 2**20,
        wall_time_s=max(ends_at - clock(), 0.001), max_output_bytes=agent.max_output_bytes)
    workdir = Path(tempfile.mkdtemp(prefix="triloop-agent-"))
    try:
        prepare_workdir(agent, contract, workdir)
        with GatewayServer(gateway) as server:
            server.environments[session.id] = port
            variables = agent_environment(server.session_url(session.id), session.id)
            only_the_gateway = reaching_loopback(sandbox, {"gateway": server.address})
            result = _run_agent(only_the_gateway, agent_argv(agent, python), sandbox_limits,
                                workdir, initial, variables, session, gateway, port, on_progress)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for failure in (session.infrastructure_error, port.infrastructure_error):
        if failure is not None:
            raise failure
    status, reason = _ending(port, session, result)
    extra = {"gateway": gateway_summary(session),
             "agent": {"command": list(agent.command), "exit_code": result.exit_code,
                       "limit_exceeded": result.limit_exceeded, "wall_s": result.wall_s,
                       "stderr_tail": result.stderr[-_STDERR_KEPT:],
                       "sandbox": describe(sandbox)}}
    env_rewards = sum(s.reward for s in port.steps)

    def record(final: str, why: str | None, outcome: Outcome | None) -> EpisodeRecord:
        outcome_reward = outcome.reward if outcome is not None else 0.0
        return EpisodeRecord(
            status=final, failure_reason=why, steps=episode_steps(session, port.steps),
            total_reward=env_rewards + outcome_reward,
            success=bool(outcome.success) if outcome is not None else False,
            outcome_details=dict(outcome.details) if outcome is not None else {},
            outcome_reward=outcome_reward, initial_observation=initial,
            checkpoint_id=policy.checkpoint_id, seed=seed, task_seed=task_seed,
            generated_tokens=session.generated_tokens, wall_time_s=clock() - started,
            extra=extra,
        )

    if status == FAILED:  # no verdict on an episode the environment could not carry out
        return record(status, reason, None)
    try:
        verdict = env.outcome()
    except INFRASTRUCTURE_ERRORS:
        raise
    except Exception as exc:
        return record(FAILED, f"outcome: {_reason(exc)}", None)
    return record(status, reason, verdict)


def _run_agent(
    sandbox: SandboxBackend, argv: list[str], limits: SandboxLimits, workdir: Path, stdin: str,
    variables: dict[str, str], session: AgentSession, gateway: Gateway,
    port: EpisodeEnvironment, on_progress: Callable[[int], None] | None,
) -> SandboxResult:
    """Run the program in a helper thread; report progress from this one (the activity's)."""
    outcome: list[SandboxResult | BaseException] = []

    def run() -> None:
        try:
            # The worker's packages, read-only: an agent may import what the worker has
            # installed (a model client); never the project folder, which holds secrets.
            outcome.append(sandbox.run(argv, limits=limits, workdir=workdir, stdin=stdin,
                                       extra_env=variables, expose=python_dependencies()))
        except BaseException as exc:  # handed to the caller's thread below
            outcome.append(exc)

    runner = threading.Thread(target=run, name="command-agent", daemon=True)
    runner.start()
    reported = -1
    while runner.is_alive():
        runner.join(0.2)
        calls = len(session.calls)
        if on_progress is not None and calls != reported:
            try:
                on_progress(calls)
            except BaseException:
                # Cancelled: refuse the agent's further model calls and actions so that it
                # ends (the sandbox's wall clock ends one that does not), then go.
                gateway.close_session(session.id)
                port.cancel("cancelled")
                runner.join(limits.wall_time_s + 5)
                raise
            reported = calls
    gateway.close_session(session.id)
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _ending(port: EpisodeEnvironment, session: AgentSession,
            result: SandboxResult) -> tuple[str, str | None]:
    if port.end is not None:
        return port.end
    if session.budget_exhausted:
        return TRUNCATED, "max_total_tokens"
    if result.limit_exceeded == "wall_time":
        return TRUNCATED, port.ends_because
    if result.limit_exceeded is not None:
        return TRUNCATED, result.limit_exceeded
    if result.exit_code != 0:  # a crash (on import or later) is the program's own failure
        return FAILED, crash_reason(result)
    return TRUNCATED, "agent_exited"


def crash_reason(result: SandboxResult) -> str:
    """``agent_failed (exit N): <stderr tail>``: why a program that crashed ended."""
    tail = result.stderr.strip()[-_STDERR_IN_REASON:]
    return f"agent_failed (exit {result.exit_code}): {tail or 'nothing on stderr'}"


def episode_steps(session: AgentSession, env_steps: list[EnvironmentStep]) -> list[StepRecord]:
    """One step per main-loop call: prompt as fed, sampled ids, their mask and logprobs.

    Each prompt is the call's view into the session's one sequence (no copy), so the store
    packs them back into that same sequence, spliced call by call as they were made.
    """
    main = session.main_calls()
    trajectory = session.trajectory
    breaks = {b.call: b for b in trajectory.breaks}
    replies: dict[int, list[EnvironmentStep]] = {}
    for step in env_steps:  # a reply belongs to the main-loop call that preceded it
        replies.setdefault(max(step.main_calls_before - 1, 0), []).append(step)
    records: list[StepRecord] = []
    for k, call in enumerate(main):
        answered = replies.get(k, [])
        placed = trajectory.placements[k]
        segment, observed = placed.segment, placed.observation_tokens
        feedback: dict[str, Any] = {
            "gateway_call": call.index, "api": call.api, "kind": call.kind,
            "segment": segment, "observation_tokens": observed,
            "environment_steps": [{"action": s.action, "reward": s.reward, "done": s.done,
                                   "feedback": s.feedback} for s in answered],
        }
        if k in breaks:
            feedback["trajectory_break"] = asdict(breaks[k])
        records.append(StepRecord(
            index=k, prompt_token_ids=call.prompt_token_ids,
            action_token_ids=call.completion_token_ids,
            action_mask=step_action_mask(len(call.prompt_token_ids),
                                         len(call.completion_token_ids)),
            behaviour_logprobs=call.logprobs,
            observation="\n".join(s.observation for s in answered), action_text=call.text,
            reward=sum(s.reward for s in answered), done=any(s.done for s in answered),
            feedback=feedback, finish_reason=call.finish_reason,
        ))
    return records


def gateway_summary(session: AgentSession) -> dict[str, Any]:
    """What the episode's record keeps about its model traffic."""
    trajectory = session.trajectory
    main_index = {call.index: k for k, call in enumerate(session.main_calls())}
    return {
        "session": session.id, "kinds": session.kinds(), "main_calls": len(session.main_calls()),
        "segments": trajectory.segments, "breaks": [asdict(b) for b in trajectory.breaks],
        "main_sampled_tokens": trajectory.sampled_tokens,
        "generated_tokens": session.generated_tokens,
        "context_overflows": session.context_overflows,
        "calls": [_call_summary(c, main_index.get(c.index)) for c in session.calls],
    }


def _call_summary(call: CallRecord, step: int | None) -> dict[str, Any]:
    """A call as the record keeps it: main-loop calls point at their step, which holds the
    ids; the other kinds keep their sampled ids and logprobs here (not trained on today)."""
    summary: dict[str, Any] = {
        "index": call.index, "api": call.api, "kind": call.kind, "rule": call.rule,
        "prompt_tokens": len(call.prompt_token_ids),
        "completion_tokens": len(call.completion_token_ids),
        "finish_reason": call.finish_reason,
        "requested_temperature": call.requested_temperature,
        "requested_max_tokens": call.requested_max_tokens,
    }
    if step is not None:
        summary["step"] = step
    else:
        summary["sampled_token_ids"] = call.completion_token_ids
        summary["behaviour_logprobs"] = call.logprobs
    return summary
