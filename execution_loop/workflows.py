"""``RolloutWorkflow``: a batch of episodes, bounded concurrency, one activity per group.

Deterministic code only (no torch, database or network here); the activities in
``execution_loop.activities`` are called through the typed contracts in
``execution_loop.contracts``.

- Episode ids are ``f"{batch_id}:{item_index}:{sample}"``: a retried activity, a
  replayed workflow or a restarted worker all write under the same id, and the
  store keeps the first write only.
- Each group of episodes (cut into chunks of at most ``max_concurrency``) runs as one
  activity with its episodes concurrent (``execution_loop.group_runner``): the inference
  engine batches their turns, and their trajectories are authorized per set and stored in
  one transaction. An episode that fails on its own fails alone; an infrastructure error
  retries the activity, which reports what it stored and plays only the rest. Shadow
  episodes run one activity each after their production episode is stored.
- At most ``max_concurrency`` episodes run at once. Each gets the batch deadline;
  it stops itself at its next turn after it (recorded ``truncated``, with the
  steps it took). A workflow timer at the deadline plus a grace period cancels
  whatever is still running, and one activity records every episode without a
  row as truncated.
- Only infrastructure errors are retried; the activity marks everything else
  non-retryable and the episode counts as failed.
- Liveness (``execution_loop.liveness``): an episode activity heartbeats while its
  episodes make progress (steps, decoded tokens, checkpoint loading), every
  ``heartbeat_timeout_s`` at most. A group whose episode stalls that long fails with a
  ``HeartbeatTimeout`` naming the stage; a worker that goes silent times out in Temporal.
  Either way the batch's result says why it lost those episodes (``lost``: "heartbeat
  timeout while decoding turn 3 of episode ..."), and so does its requester's failure.
- Production batches ask governance's routing (an activity reading its tables)
  who serves each episode; other purposes run the checkpoint the caller names.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as TemporalTimeout

with workflow.unsafe.imports_passed_through():
    from execution_loop import contracts as c
    from execution_loop.contracts import (
        HEARTBEAT_TIMEOUT,
        EpisodeGroupInput,
        EpisodeInput,
        EpisodeSpec,
        EpisodeSummary,
        HeartbeatReport,
        RouteInput,
        TruncateInput,
    )
    from triloop.episode_plan import planned_episodes
    from triloop.statuses import EpisodeStatus, Purpose
    from triloop.workflow_api import (
        ADMISSION_PROBE_WORKFLOW,
        DESCRIBE_TASKS_WORKFLOW,
        ROLLOUT_WORKFLOW,
        AdmissionProbeEvidence,
        AdmissionProbeInput,
        DescribeTasksInput,
        DescribeTasksResult,
        RolloutBatchInput,
        RolloutBatchResult,
    )

# Batches started since this marker run a group's episodes in one activity (histories
# recorded before it replay the one-activity-per-episode path).
EPISODE_GROUPS_PATCH = "episode-groups-in-one-activity"
# Batches cancelled since this marker cancel their running episode activities at once
# (before it, they learned of it only when the closed workflow refused their heartbeat).
CANCEL_EPISODES_PATCH = "cancel-episode-activities-with-the-batch"
PRODUCTION, SHADOW = Purpose.PRODUCTION, Purpose.SHADOW
COMPLETED, TRUNCATED, FAILED = (EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED,
                                EpisodeStatus.FAILED)
# Truncation reasons of the batch deadline: the episode's own check, and never started.
BATCH_CUTS = frozenset({"deadline", "batch_deadline"})


def episode_groups(specs: list[EpisodeSpec], max_concurrency: int) -> list[list[EpisodeSpec]]:
    """The batch's episodes by group, each group cut into chunks of ``max_concurrency``.

    A chunk runs as one activity with its episodes concurrent, so the inference engine
    batches their turns and the chunk's trajectories are authorized and stored together.
    """
    size = max(1, max_concurrency)
    groups: dict[str, list[EpisodeSpec]] = {}
    for spec in specs:
        groups.setdefault(spec.group_id, []).append(spec)
    return [members[start:start + size] for members in groups.values()
            for start in range(0, len(members), size)]


def plan_episodes(batch: RolloutBatchInput, checkpoint_id: str) -> list[EpisodeSpec]:
    """Every episode of the batch with its deterministic id (pure): the plan the batch's
    requester recorded (``triloop.episode_plan``), served by ``checkpoint_id``."""
    return [
        EpisodeSpec(
            episode_id=planned.episode_id, task_id=planned.task_id, task_seed=planned.seed,
            group_id=planned.group_id, sample_index=planned.sample_index,
            checkpoint_id=checkpoint_id, purpose=batch.purpose, continues=planned.continues,
        )
        for planned in planned_episodes(batch)
    ]


def shadow_spec(spec: EpisodeSpec) -> EpisodeSpec:
    """The shadow episode beside a production one: same task and seed, its own id."""
    assert spec.shadow_checkpoint_id is not None
    return EpisodeSpec(
        episode_id=f"{spec.episode_id}:shadow", task_id=spec.task_id, task_seed=spec.task_seed,
        group_id=f"{spec.group_id}:shadow", sample_index=spec.sample_index,
        checkpoint_id=spec.shadow_checkpoint_id, purpose=SHADOW, shadow_of=spec.episode_id,
    )


def heartbeat_report(details: object) -> HeartbeatReport:
    """The ``HeartbeatReport`` among an activity's last heartbeat details (pure); an empty
    one when there is none (a history from before reports, or no heartbeat at all)."""
    if isinstance(details, list | tuple) and len(details) > 1 and isinstance(details[1], dict):
        known = {k: v for k, v in details[1].items() if k in HeartbeatReport.__dataclass_fields__}
        try:
            return HeartbeatReport(**known)
        except TypeError:
            pass
    return HeartbeatReport()


def lost_cause(error: BaseException | None, heartbeat_timeout_s: float) -> str | None:
    """Why an episode activity lost its episodes, in words (pure); None when it failed for
    another reason (its episodes are then looked up, and count as failed).

    A group that stalled says so itself (``HeartbeatTimeout``, naming the stage); a timeout
    in Temporal names the stage of the last heartbeat that reached the server.
    """
    cause = error.cause if isinstance(error, ActivityError) else error
    if isinstance(cause, ApplicationError) and cause.type == HEARTBEAT_TIMEOUT:
        return cause.message
    if not isinstance(cause, TemporalTimeout):
        return None
    report = heartbeat_report(cause.last_heartbeat_details)
    where = f" while {report.stage}" if report.stage else ""
    if cause.type == TimeoutType.HEARTBEAT:
        return (f"heartbeat timeout{where}: the execution worker sent no heartbeat for"
                f" {heartbeat_timeout_s:g} s (it may have stopped; rollout.heartbeat_timeout_s)")
    inner = lost_cause(cause.cause, heartbeat_timeout_s)
    return inner or f"the batch deadline passed with the episodes still running{where}"


def deadline_cause(deadline_s: float, *, started: bool) -> str:
    """Why the batch deadline left an episode without a result (pure)."""
    when = "while it played" if started else "before it started"
    return f"the batch deadline (rollout.deadline_s = {deadline_s:g} s) passed {when}"


def summarize(
    batch_id: str, specs: list[EpisodeSpec], summaries: dict[str, EpisodeSummary],
    statuses: dict[str, str], stored: set[str], never_started: Collection[str] = (),
    lost: dict[str, str] | None = None,
) -> RolloutBatchResult:
    """Counts and rewards over the batch's own episodes (pure); shadows are listed apart.

    ``lost``: why episodes came back without a result (a heartbeat timeout, the deadline).

    ``stored``: episode ids with a trajectory row; ``never_started``: those the deadline
    left without one (recorded truncated here), which partial rollouts continue too.
    Rewards average over the episodes that ran; the success rate is over every episode of the batch.
    """
    result = RolloutBatchResult(batch_id=batch_id, lost=dict(lost or {}))
    rewards: list[float] = []
    successes = 0
    for spec in specs:
        status = statuses.get(spec.episode_id, FAILED)
        status = status if status in (COMPLETED, TRUNCATED) else FAILED
        result.statuses[spec.episode_id] = status
        summary = summaries.get(spec.episode_id)
        served_by = summary.checkpoint_id if summary and summary.checkpoint_id else None
        result.checkpoints[spec.episode_id] = served_by or spec.checkpoint_id
        if spec.episode_id in stored:
            result.trajectory_ids.append(spec.episode_id)
        if summary is not None:
            rewards.append(summary.total_reward)
            successes += int(summary.success)
            result.rewards[spec.episode_id] = summary.total_reward
            result.successes[spec.episode_id] = summary.success
        if spec.purpose == "training" and status == TRUNCATED and (
                spec.episode_id in never_started
                or (summary is not None and summary.failure_reason in BATCH_CUTS)):
            result.cut_episodes.append(spec.episode_id)
        if status == COMPLETED:
            result.completed += 1
        elif status == TRUNCATED:
            result.truncated += 1
        else:
            result.failed += 1
        if spec.shadow_checkpoint_id is not None and f"{spec.episode_id}:shadow" in summaries:
            result.shadow_trajectory_ids.append(f"{spec.episode_id}:shadow")
    result.mean_reward = sum(rewards) / len(rewards) if rewards else 0.0
    result.success_rate = successes / len(specs) if specs else 0.0
    return result


@workflow.defn(name=ROLLOUT_WORKFLOW)
class RolloutWorkflow:
    """Runs a batch of episodes and returns what finished by its deadline."""

    @workflow.run
    async def run(self, batch: RolloutBatchInput) -> RolloutBatchResult:
        """Plan, route, run with bounded concurrency, truncate the rest, summarize."""
        started = workflow.now()
        deadline_epoch = started.timestamp() + batch.deadline_s
        heartbeat = timedelta(seconds=batch.heartbeat_timeout_s)
        grace = batch.heartbeat_timeout_s + 5.0  # in-flight turns finish, write and report
        specs = await self._plan(batch)
        summaries: dict[str, EpisodeSummary] = {}
        statuses: dict[str, str] = {}
        lost: dict[str, str] = {}  # episode id -> why the batch lost it
        playing: set[str] = set()  # episodes whose activity was started
        slots = asyncio.Semaphore(max(1, batch.max_concurrency))

        def episode_input(spec: EpisodeSpec) -> EpisodeInput:
            return EpisodeInput(spec, batch.batch_id, batch.run_id, batch.policy_version,
                                batch.temperature, deadline_epoch, batch.max_turns,
                                batch.max_new_tokens)

        async def run_one(spec: EpisodeSpec) -> None:
            left = deadline_epoch - workflow.now().timestamp()
            if left <= 0:
                return  # never started: recorded as truncated below
            playing.add(spec.episode_id)
            try:
                summary = await c.RUN_EPISODE.call(
                    episode_input(spec), schedule_to_close=timedelta(seconds=left + grace),
                    heartbeat=heartbeat)
            except ActivityError as err:
                why = lost_cause(err, batch.heartbeat_timeout_s)
                if why is not None:
                    lost[spec.episode_id] = why  # recorded truncated below, with the cause
                elif not isinstance(err.cause, TemporalTimeout):
                    statuses[spec.episode_id] = FAILED
                    workflow.logger.warning("episode %s failed: %s", spec.episode_id, err.cause)
                return
            summaries[spec.episode_id] = summary
            statuses[spec.episode_id] = summary.status

        async def run_with_shadow(spec: EpisodeSpec) -> None:
            async with slots:
                await run_one(spec)
                if spec.shadow_checkpoint_id is not None and spec.episode_id in summaries:
                    await run_one(shadow_spec(spec))

        unsettled: list[EpisodeSpec] = []  # groups that failed for good: what got stored?
        in_use = [0]  # episodes running (grouped path), at most max_concurrency

        async def run_group(chunk: list[EpisodeSpec]) -> None:
            left = deadline_epoch - workflow.now().timestamp()
            if left <= 0:
                return  # never started: recorded as truncated below
            playing.update(s.episode_id for s in chunk)
            try:
                result = await c.RUN_EPISODE_GROUP.call(
                    EpisodeGroupInput([episode_input(s) for s in chunk]),
                    schedule_to_close=timedelta(seconds=left + grace), heartbeat=heartbeat)
            except ActivityError as err:
                why = lost_cause(err, batch.heartbeat_timeout_s)
                if why is not None:  # what it stored is found, the rest recorded, below
                    lost.update((s.episode_id, why) for s in chunk)
                elif not isinstance(err.cause, TemporalTimeout):
                    unsettled.extend(chunk)
                    workflow.logger.warning("episode group %s failed: %s",
                                            chunk[0].group_id, err.cause)
                return
            for summary in result.summaries:
                summaries[summary.episode_id] = summary
                statuses[summary.episode_id] = summary.status
            for episode_id, why in result.failed.items():
                statuses[episode_id] = FAILED
                workflow.logger.warning("episode %s failed: %s", episode_id, why)

        async def occupy(count: int) -> None:
            limit = max(1, batch.max_concurrency)  # a chunk is never larger than it
            # Check again on waking: every waiter whose condition held resumes together.
            while in_use[0] + count > limit:
                await workflow.wait_condition(lambda: in_use[0] + count <= limit)
            in_use[0] += count

        async def run_chunk_with_shadows(chunk: list[EpisodeSpec]) -> None:
            await occupy(len(chunk))
            try:
                await run_group(chunk)
            finally:
                in_use[0] -= len(chunk)

            async def shadow(spec: EpisodeSpec) -> None:  # needs production's stored steps
                await occupy(1)
                try:
                    await run_one(shadow_spec(spec))
                finally:
                    in_use[0] -= 1

            await asyncio.gather(*(shadow(s) for s in chunk if s.shadow_checkpoint_id
                                   is not None and s.episode_id in summaries))

        if workflow.patched(EPISODE_GROUPS_PATCH):
            tasks = [asyncio.create_task(run_chunk_with_shadows(chunk))
                     for chunk in episode_groups(specs, batch.max_concurrency)]
        else:
            tasks = [asyncio.create_task(run_with_shadow(spec)) for spec in specs]
        try:
            await workflow.wait_condition(
                lambda: all(t.done() for t in tasks), timeout=batch.deadline_s + grace
            )
        except TimeoutError:  # the builtin: wait_condition timed out
            for task in tasks:
                task.cancel()
        except asyncio.CancelledError:  # the batch itself is cancelled (its run was)
            if workflow.patched(CANCEL_EPISODES_PATCH):
                for task in tasks:  # asks each running activity to stop its episodes now
                    task.cancel()
            raise
        await asyncio.gather(*tasks, return_exceptions=True)

        stored = set(summaries)
        if unsettled:
            found = await c.RECORD_TRUNCATED.call(
                TruncateInput([episode_input(s) for s in unsettled], record_missing=False))
            for spec in unsettled:
                statuses[spec.episode_id] = found.statuses.get(spec.episode_id, FAILED)
            stored.update(found.statuses)
        left_over = [episode_input(s) for s in specs if s.episode_id not in statuses]
        for job in left_over:
            episode_id = job.spec.episode_id
            lost.setdefault(episode_id, deadline_cause(batch.deadline_s,
                                                       started=episode_id in playing))
        if left_over:
            recorded = await c.RECORD_TRUNCATED.call(TruncateInput(left_over, reasons={
                job.spec.episode_id: "heartbeat_timeout" for job in left_over
                if lost[job.spec.episode_id].startswith("heartbeat timeout")}))
            statuses.update(recorded.statuses)
            stored.update(recorded.statuses)
        return summarize(batch.batch_id, specs, summaries, statuses, stored,
                         {job.spec.episode_id for job in left_over},
                         {e: why for e, why in lost.items() if e not in summaries})

    async def _plan(self, batch: RolloutBatchInput) -> list[EpisodeSpec]:
        if batch.purpose != PRODUCTION:
            if not batch.checkpoint_id:
                raise ApplicationError(
                    f"a {batch.purpose!r} batch must name checkpoint_id; only production "
                    "batches are routed by governance", non_retryable=True,
                    type="MissingCheckpoint",
                )
            return plan_episodes(batch, batch.checkpoint_id)
        if batch.checkpoint_id:
            raise ApplicationError(
                "production batches are served by governance's routing; leave checkpoint_id "
                f"unset (got {batch.checkpoint_id!r})", non_retryable=True,
                type="CheckpointNotRoutable",
            )
        specs = plan_episodes(batch, "")
        routed = await c.ROUTE_EPISODES.call(RouteInput([s.episode_id for s in specs]))
        for spec, decision in zip(specs, routed.decisions, strict=True):
            spec.checkpoint_id = decision.checkpoint_id
            spec.purpose = decision.purpose
            spec.shadow_checkpoint_id = decision.shadow_checkpoint_id
        return specs


@workflow.defn(name=ADMISSION_PROBE_WORKFLOW)
class AdmissionProbeWorkflow:
    """The admission probe as a workflow, so governance can ask for it through Nexus."""

    @workflow.run
    async def run(self, request: AdmissionProbeInput) -> AdmissionProbeEvidence:
        return await c.PROBE_ADMISSION.call(request)


@workflow.defn(name=DESCRIBE_TASKS_WORKFLOW)
class DescribeTasksWorkflow:
    """The content digests and tags of a source's tasks, for governance, through Nexus."""

    @workflow.run
    async def run(self, request: DescribeTasksInput) -> DescribeTasksResult:
        return await c.DESCRIBE_TASKS.call(request)
