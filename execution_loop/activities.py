"""Rollout activities: run one episode, route production episodes, record truncated ones.

Activities are synchronous (torch inference, subprocess sandboxes) and run on the
worker's thread pool. ``RolloutActivities`` receives every dependency from
``execution_loop.worker``: the execution role's engine, the authorizer, the policy
cache and the task environments.

Errors: infrastructure failures (inference server, sandbox, verifier, database
connection) propagate and Temporal retries them; everything else becomes a
non-retryable ``ApplicationError`` so a broken environment, a policy denial or a
missing checkpoint fails the episode once instead of burning retries.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import psycopg
import sqlalchemy.exc
from sqlalchemy import Engine
from sqlmodel import Session, col, select
from temporalio import activity
from temporalio.exceptions import ApplicationError, CancelledError

from execution_loop.command_agent import run_command_episode
from execution_loop.contracts import (
    RECORD_TRUNCATED,
    ROUTE_EPISODES,
    RUN_EPISODE,
    EpisodeInput,
    EpisodeSpec,
    EpisodeSummary,
    RouteDecision,
    RouteInput,
    RouteResult,
    TruncateInput,
    TruncateResult,
)
from execution_loop.episode import (
    INFRASTRUCTURE_ERRORS,
    EpisodeRecord,
    StepRecord,
    episode_limits,
    run_episode,
)
from execution_loop.liveness import (
    CANCELLED,
    EpisodeLiveness,
    WatchedPolicy,
    heartbeat_pump,
)
from execution_loop.partial_episodes import (
    ContinuationRefused,
    PriorEpisode,
    load_prior_episode,
)
from execution_loop.routing import assign, read_routes, shadow_comparison
from execution_loop.sandbox import SandboxBackend
from execution_loop.sandboxes import default_sandbox, describe_environment_sandbox
from execution_loop.serving import PolicyCache, TaskEnvironments
from execution_loop.store import (
    StepRow,
    TrajectoryRow,
    trajectory_statuses,
    write_trajectory,
)
from triloop.faults import ServingFault
from triloop.faults import describe as describe_fault
from triloop.models import Trajectory
from triloop.policy import Authorizer, PolicyDenied
from triloop.statuses import EpisodeStatus, Purpose

# Faults degrade serving only: training and eval batches name their checkpoint themselves.
SERVED_PURPOSES = (Purpose.PRODUCTION, Purpose.CANARY)

_RETRYABLE: tuple[type[BaseException], ...] = (
    *INFRASTRUCTURE_ERRORS,
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    psycopg.OperationalError,
    ConnectionError,
    TimeoutError,
)


def is_infrastructure_error(exc: BaseException) -> bool:
    """Whether retrying could help: the machinery failed, not the episode's content."""
    return isinstance(exc, _RETRYABLE)


def non_retryable(exc: Exception) -> ApplicationError:
    """The episode's own failure, surfaced once with its type and message."""
    return ApplicationError(f"{type(exc).__name__}: {exc}", type=type(exc).__name__,
                            non_retryable=True)


def episode_seed(episode_id: str) -> int:
    """The sampling seed of an episode, fixed by its id (retries sample the same way)."""
    return int.from_bytes(hashlib.sha256(episode_id.encode()).digest()[:8], "big") % 2**31


def _step_row(step: StepRecord, extra: dict[str, Any] | None = None,
              policy_version: int | None = None) -> StepRow:
    feedback = dict(step.feedback)
    feedback["finish_reason"] = step.finish_reason
    if extra:
        feedback.update(extra)
    return StepRow(
        index=step.index, prompt_token_ids=step.prompt_token_ids,
        action_token_ids=step.action_token_ids, action_mask=step.action_mask,
        behaviour_logprobs=step.behaviour_logprobs, observation=step.observation,
        action_text=step.action_text, feedback=feedback, reward=step.reward, done=step.done,
        policy_version=policy_version,
    )


def trajectory_row(
    record: EpisodeRecord, job: EpisodeInput, outcome: dict[str, Any]
) -> TrajectoryRow:
    """The trajectory row of a finished episode."""
    spec = job.spec
    return TrajectoryRow(
        id=spec.episode_id, batch_id=job.batch_id, task_id=spec.task_id,
        checkpoint_id=spec.checkpoint_id, purpose=spec.purpose, group_id=spec.group_id,
        status=record.status, sample_index=spec.sample_index, run_id=job.run_id,
        policy_version=job.policy_version, failure_reason=record.failure_reason,
        success=record.success, total_reward=record.total_reward, num_steps=len(record.steps),
        outcome=outcome,
    )


def stub_row(job: EpisodeInput, reason: str) -> TrajectoryRow:
    """A truncated episode that never produced a step (the deadline came first)."""
    spec = job.spec
    outcome: dict[str, Any] = {"shadow_of": spec.shadow_of} if spec.shadow_of else {}
    return TrajectoryRow(
        id=spec.episode_id, batch_id=job.batch_id, task_id=spec.task_id,
        checkpoint_id=spec.checkpoint_id, purpose=spec.purpose, group_id=spec.group_id,
        status=EpisodeStatus.TRUNCATED, sample_index=spec.sample_index, run_id=job.run_id,
        policy_version=job.policy_version, failure_reason=reason, outcome=outcome,
    )


def _summary(row: Trajectory | TrajectoryRow, *, written: bool) -> EpisodeSummary:
    return EpisodeSummary(row.id, row.status, row.success, row.total_reward, row.num_steps,
                          written, row.checkpoint_id, row.failure_reason)


def episode_summary(row: Trajectory | TrajectoryRow, *, written: bool) -> EpisodeSummary:
    """What the workflow is told about an episode this call wrote (or found stored)."""
    return _summary(row, written=written)


class RolloutActivities:
    """The execution loop's activities, bound to their dependencies."""

    def __init__(
        self, *, engine: Engine, authorizer: Authorizer, policies: PolicyCache,
        environments: TaskEnvironments,
        serving_faults: Callable[[], Mapping[str, ServingFault]] = dict,
        agent_sandbox: SandboxBackend | None = None,
    ) -> None:
        self._engine = engine
        # Where a contract's black-box agent program runs (the command harness); None: the
        # default per contract, which fails closed (``sandboxes.default_sandbox``).
        self._agent_sandbox = agent_sandbox
        self._authorizer = authorizer
        self._policies = policies
        self._environments = environments
        self._serving_faults = serving_faults

    @activity.defn(name=RUN_EPISODE.name, no_thread_cancel_exception=True)
    def run_episode(self, job: EpisodeInput) -> EpisodeSummary:
        """Play one episode, heartbeating while it progresses, and store it once."""
        info = activity.info()
        if info.attempt > 1:
            stored = self._stored(job.spec.episode_id)
            if stored is not None:  # an earlier attempt wrote it, then lost its report
                return stored
        timeout = info.heartbeat_timeout
        liveness = EpisodeLiveness(timeout.total_seconds() if timeout else None)
        liveness.started(job.spec.episode_id)
        try:
            with heartbeat_pump(liveness):
                row, steps = self._play(job, liveness)
            written = write_trajectory(
                engine=self._engine, authorizer=self._authorizer, trajectory=row, steps=steps
            )
        except CancelledError:
            raise
        except Exception as exc:
            if is_infrastructure_error(exc):
                raise
            raise non_retryable(exc) from exc
        if not written:  # another run of this episode got there first: report what it stored
            return self._stored(row.id) or _summary(row, written=False)
        return _summary(row, written=True)

    def _stored(self, episode_id: str) -> EpisodeSummary | None:
        with Session(self._engine) as session:
            stored = session.get(Trajectory, episode_id)
        return None if stored is None else _summary(stored, written=False)

    def _rerouted(self, job: EpisodeInput) -> tuple[EpisodeInput, str | None]:
        """Route a production episode again as it starts: a rollback applies to the next one.

        The batch routed every episode when it began; if governance moved production
        (a promotion or a rollback) since, this episode follows the routing table now.
        Returns the job to play and the checkpoint it was first routed to, if that changed.
        """
        spec = job.spec
        if spec.purpose not in SERVED_PURPOSES or spec.shadow_of is not None:
            return job, None
        current = assign(spec.episode_id, read_routes(self._engine))
        if current.checkpoint_id == spec.checkpoint_id:
            return job, None
        moved = dataclasses.replace(spec, checkpoint_id=current.checkpoint_id,
                                    purpose=current.purpose)
        return dataclasses.replace(job, spec=moved), spec.checkpoint_id

    def play(
        self, job: EpisodeInput, liveness: EpisodeLiveness
    ) -> tuple[TrajectoryRow, list[StepRow]]:
        """Play one episode and build its rows (not stored); a group runner's entry point.

        The episode's signs of life (steps, decoded tokens, loading) go to ``liveness``,
        whose pump heartbeats for the activity; a cancelled activity stops the episode.
        """
        return self._play(job, liveness)

    def _play(
        self, job: EpisodeInput, liveness: EpisodeLiveness
    ) -> tuple[TrajectoryRow, list[StepRow]]:
        job, rerouted_from = self._rerouted(job)
        spec = job.spec
        episode_id = spec.episode_id
        opened = self._environments.task(spec.task_id)
        # Loading a large checkpoint can outlast the heartbeat timeout: it counts as alive.
        with liveness.loading(episode_id, spec.checkpoint_id):
            loaded = self._policies.get(spec.checkpoint_id)
        info = activity.info()
        restarted_after = info.heartbeat_details[0] if info.heartbeat_details else 0

        temperature = job.temperature
        fault = (self._serving_faults().get(spec.checkpoint_id)
                 if spec.purpose in SERVED_PURPOSES else None)
        if fault is not None:  # an operator's game day: serve this checkpoint degraded
            temperature = fault.temperature

        def report(steps_done: int) -> None:  # steps (or agent model calls) done
            if liveness.should_stop():
                raise CancelledError(CANCELLED)
            liveness.stepped(episode_id, steps_done)

        prior = self._prior(job, agent=opened.contract.agent is not None)
        policy = WatchedPolicy(loaded, liveness, episode_id=episode_id,
                               owner=job.run_id or job.batch_id,
                               turns_before=len(prior.steps) if prior else 0)
        env = opened.open()
        seed = episode_seed(spec.shadow_of or spec.episode_id)
        try:
            limits = episode_limits(opened.contract.limits, job.max_turns, job.max_new_tokens)
            if opened.contract.agent is not None:  # a black-box agent, through the gateway
                sandbox = self._agent_sandbox or default_sandbox(
                    allow_unisolated=opened.contract.allows_unisolated)
                record = run_command_episode(
                    env, policy, contract=opened.contract, sandbox=sandbox,
                    seed=seed, task_seed=spec.task_seed, task_item=opened.item, limits=limits,
                    temperature=temperature, deadline=job.deadline_epoch_s,
                    on_progress=report,
                )
            else:
                record = run_episode(
                    env, policy, seed=seed, task_seed=spec.task_seed, task_item=opened.item,
                    limits=limits, context_rule=opened.contract.context,
                    on_step=lambda step: report(step.index + 1),
                    deadline=job.deadline_epoch_s, temperature=temperature,
                    resume=prior.steps if prior else (),
                )
        finally:
            env.close()
        outcome: dict[str, Any] = {
            "verifier": record.outcome_details, "outcome_reward": record.outcome_reward,
            "seed": record.seed, "task_seed": record.task_seed,
            "generated_tokens": record.generated_tokens, "wall_time_s": record.wall_time_s,
            "initial_observation_sha256": hashlib.sha256(
                record.initial_observation.encode()).hexdigest(),
            "environment_version_id": opened.environment_version_id,
            "attempt": info.attempt, "restarted_after_steps": restarted_after,
            **record.extra,  # the command harness: the gateway's record and the agent's exit
        }
        outcome["sandbox"] = describe_environment_sandbox(env)
        if fault is not None:
            outcome["injected_fault"] = describe_fault(fault)
        if rerouted_from is not None:
            outcome["rerouted_from"] = rerouted_from
        if prior is not None:
            outcome["continues"] = spec.continues
        if spec.shadow_of is None:
            versions = prior.versions if prior else []
            return trajectory_row(record, job, outcome), [
                _step_row(s, policy_version=versions[i] if i < len(versions) else None)
                for i, s in enumerate(record.steps)]
        comparison, extras = shadow_comparison(
            engine=self._engine, production_id=spec.shadow_of,
            initial_sha256=outcome["initial_observation_sha256"],
            observations=[s.observation for s in record.steps],
            actions=[s.action_text for s in record.steps],
        )
        outcome.update(comparison)
        steps = [_step_row(s, extra) for s, extra in zip(record.steps, extras, strict=True)]
        return trajectory_row(record, job, outcome), steps

    def _prior(self, job: EpisodeInput, *, agent: bool) -> PriorEpisode | None:
        """The cut episode a continuation resumes (partial rollouts), or None."""
        spec = job.spec
        if spec.continues is None:
            return None
        if agent:  # a black-box agent's own state cannot be replayed from its turns
            raise ContinuationRefused(f"task {spec.task_id!r} runs a black-box agent; its"
                                      " episodes cannot be continued")
        return load_prior_episode(engine=self._engine, prior_id=spec.continues,
                                  run_id=job.run_id, task_id=spec.task_id,
                                  group_id=spec.group_id)

    def stored_summaries(self, episode_ids: list[str]) -> dict[str, EpisodeSummary]:
        """What is already stored among ``episode_ids`` (a retried group reports it)."""
        if not episode_ids:
            return {}
        with Session(self._engine) as session:
            rows = session.exec(
                select(Trajectory).where(col(Trajectory.id).in_(episode_ids))).all()
        return {row.id: _summary(row, written=False) for row in rows}

    @activity.defn(name=ROUTE_EPISODES.name)
    def route_production_episodes(self, request: RouteInput) -> RouteResult:
        """Ask governance's routing tables who serves each production episode."""
        try:
            routes = read_routes(self._engine)
            decisions = [assign(episode_id, routes) for episode_id in request.episode_ids]
        except LookupError as exc:
            raise non_retryable(exc) from exc
        return RouteResult([
            RouteDecision(e, d.checkpoint_id, d.purpose, d.shadow_checkpoint_id)
            for e, d in zip(request.episode_ids, decisions, strict=True)
        ])

    @activity.defn(name=RECORD_TRUNCATED.name)
    def record_truncated_episodes(self, request: TruncateInput) -> TruncateResult:
        """Store a truncated row for every episode without one; report what is stored."""
        ids = [job.spec.episode_id for job in request.episodes]
        present = trajectory_statuses(engine=self._engine, ids=ids)
        if not request.record_missing:
            return TruncateResult(present)
        for job in request.episodes:
            if job.spec.episode_id in present:
                continue
            reason = request.reasons.get(job.spec.episode_id, request.reason)
            try:
                write_trajectory(engine=self._engine, authorizer=self._authorizer,
                                 trajectory=stub_row(job, reason), steps=[])
            except PolicyDenied as denied:  # nothing written; the episode counts as failed
                activity.logger.warning("truncated record refused: %s", denied)
        return TruncateResult(trajectory_statuses(engine=self._engine, ids=ids))


def activities_of(rollout: RolloutActivities) -> list[Callable[..., Any]]:
    """Every activity the execution worker registers."""
    return [rollout.run_episode, rollout.route_production_episodes,
            rollout.record_truncated_episodes]


__all__ = ["EpisodeSpec", "RolloutActivities"]
