"""``TrainingRunWorkflow``: rollout and update, overlapped one iteration, for one training run.

Deterministic code only (no torch, database or network); activities are called through
their typed contracts in ``learning_loop.contracts``.

Iteration k (1-based) learns from rollout batch k and writes checkpoint c_k, policy
version k; the base model is c_0. While the update of iteration k runs on the
``learning-gpu`` queue (from c_{k-1}), the rollout of iteration k+1 already runs in the
execution loop (its ``run_rollouts`` Nexus operation) with c_{k-1}, the latest checkpoint
there is. So each update sees samples at most one policy version old (bounded staleness
1), and the update's off-policy guard (``update.max_staleness``) decides from each
sample's ``policy_version``.

People pause, resume and cancel by signal; each request is checked against the policy
again by an activity before it changes anything, and takes effect between steps (a
cancel also cancels a running rollout; an update in flight finishes and is kept). A
stability alarm pauses the run when ``stability.pause_on_alarm`` is set, and a run that
raised any alarm ends ``completed_with_alarms`` rather than ``completed``. Every
``schedule.propose_every`` iterations the latest checkpoint is proposed to governance: a
proposal row, then governance's ``propose_candidate`` Nexus operation, which opens the
promotion (learning holds no permission in governance's namespace). After
``continue_as_new_every`` iterations the workflow continues as new, carrying the
iteration and the latest checkpoint. A placebo run (``advantage.zero_task_reward``) never
proposes: its last checkpoint is the placebo that governance's placebo check compares the
candidates of the same config with, and its end says so. Each update names the checkpoints
its run's rollouts in flight are served from, so that retention (after the update is
stored) keeps them.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, NexusOperationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from learning_loop import contracts as m
    from learning_loop.asynchrony import rollouts_to_start
    from learning_loop.dynamic_data import (
        curriculum_series,
        curriculum_tasks,
        groups_to_resample,
        informative_groups,
        max_turns_at,
        record_pass_rates,
        rollout_items,
        tasks_for_sampling,
    )
    from learning_loop.mitigation import MitigationState, decide_mitigation
    from learning_loop.partial_rollouts import (
        GroupsOfUpdate,
        plan_continuations,
        settle,
    )
    from triloop.curriculum import curriculum_problems
    from triloop.nexus_api import ExecutionService, GovernanceService, endpoint_for
    from triloop.run_config import RunConfig, RunConfigError
    from triloop.statuses import RunStatus as RunState
    from triloop.workflow_api import (
        GOVERNANCE_QUEUE,
        LEARNING_GPU_QUEUE,
        MODEL_IMPORT_WORKFLOW,
        RUN_CANCEL_SIGNAL,
        RUN_PAUSE_SIGNAL,
        RUN_RESUME_SIGNAL,
        RUN_STATUS_QUERY,
        TRAINING_RUN_WORKFLOW,
        ContinuedEpisode,
        ModelImportInput,
        ModelImportResult,
        PromotionInput,
        RolloutBatchInput,
        RolloutBatchResult,
        RolloutItem,
        RunControl,
        RunStatus,
        TrainingRunInput,
        continuation_episode_id,
        sibling_queue,
    )

__all__ = [
    "ModelImportWorkflow", "TrainingRunWorkflow", "completion", "lost_batch", "placebo_completion",
    "rollout_items",
]

T = TypeVar("T")
# Episodes of one training batch at once: as many as the batching engine decodes together
# (execution_loop.inference.batching), so a batch's groups share one decode; each
# execution worker still runs at most its own max_concurrent_episodes.
MAX_ROLLOUT_CONCURRENCY = 64
PROPOSAL_TIMEOUT = timedelta(minutes=10)


def completion(iterations: int, state: RunStatus) -> tuple[str, str]:
    """How a run that did all its iterations ends: with its alarms named, if it raised any.

    An alarm on the last iteration (which may have paused the run) is not overwritten by
    ``completed``: whoever looks at the run, or proposes from it, sees that it alarmed.
    """
    if not state.alarms_raised:
        return RunState.completed, f"{iterations} iterations"
    last = f"; last: {state.alarms[-1]}" if state.alarms else ""
    return RunState.completed_with_alarms, (f"{iterations} iterations with {state.alarms_raised}"
                                     f" stability alarm(s){last}")


def placebo_completion(reason: str, checkpoint_id: str | None) -> str:
    """A placebo run's end: what ``completion`` says, and which checkpoint is the placebo."""
    return (f"{reason}; placebo run (advantage.zero_task_reward): its last checkpoint"
            f" {checkpoint_id} is the placebo, never proposed for promotion")


def lost_batch(batch: RolloutBatchResult) -> str | None:
    """Why a rollout batch came back with nothing at all, when every episode was lost (pure).

    A batch whose every episode timed out (or never started before its deadline) cannot
    train; the run fails naming that cause rather than the update's "no trainable data".
    """
    episodes = list(batch.statuses)
    if not episodes or any(episode not in batch.lost for episode in episodes):
        return None
    causes = Counter(batch.lost[episode] for episode in episodes).most_common()
    listed = "; ".join(f"{count} episode(s): {why}" for why, count in causes[:3])
    more = f"; and {len(causes) - 3} other cause(s)" if len(causes) > 3 else ""
    return (f"rollout batch {batch.batch_id} came back empty: all {len(episodes)} episodes "
            f"were lost ({listed}{more})")


# The input's RunConfig was validated by the web service; one that fails to decode (a
# client that skipped the web) fails the run at once instead of retrying its first task.
@workflow.defn(name=TRAINING_RUN_WORKFLOW,
               failure_exception_types=[ValidationError, RunConfigError])
class TrainingRunWorkflow:
    """Iterations of rollout (execution loop) and update (learning-gpu) for one run."""

    def __init__(self) -> None:
        self._state = RunStatus(run_id="", status=RunState.starting)
        self._controls: list[tuple[str, RunControl]] = []
        self._cancelled = False
        # Dynamic data (issue 18): each batch's groups and what the learner should record.
        self._batch_items: dict[str, list[RolloutItem]] = {}
        self._batch_series: dict[str, dict[str, float]] = {}
        self._pass_history: dict[str, list[float]] = {}
        self._mitigation = MitigationState()
        # Partial rollouts: cut episodes waiting for the next batch, the continuations sent
        # (by their own episode id), and each batch's continuations.
        self._to_continue: list[ContinuedEpisode] = []
        self._continuations: dict[str, ContinuedEpisode] = {}
        self._batch_continued: dict[str, list[ContinuedEpisode]] = {}
        # Retention: the checkpoint each rollout in flight is served from, which the prune
        # after an update must keep however old it is (staleness_window > 1, rollbacks).
        self._rollout_checkpoints: dict[asyncio.Task[RolloutBatchResult], str] = {}

    @workflow.signal(name=RUN_PAUSE_SIGNAL)
    def pause(self, control: RunControl) -> None:
        """A person asks to pause (checked by the policy before it acts)."""
        self._controls.append(("pause", control))

    @workflow.signal(name=RUN_RESUME_SIGNAL)
    def resume(self, control: RunControl) -> None:
        """A person asks to resume a paused run."""
        self._controls.append(("resume", control))

    @workflow.signal(name=RUN_CANCEL_SIGNAL)
    def cancel(self, control: RunControl) -> None:
        """A person asks to cancel the run."""
        self._controls.append(("cancel", control))

    @workflow.query(name=RUN_STATUS_QUERY)
    def status(self) -> RunStatus:
        """Where the run stands."""
        return self._state

    @workflow.run
    async def run(self, run: TrainingRunInput) -> RunStatus:
        """Validate, register the base, iterate; fail with the cause if a step fails."""
        config = run.config
        state = self._state
        state.run_id, state.iterations = run.run_id, config.schedule.iterations
        state.iterations_done, state.latest_checkpoint_id = run.start_iteration, \
            run.latest_checkpoint_id
        state.alarms_raised = run.alarms_raised
        self._pass_history = {k: list(v) for k, v in run.task_pass_history.items()}
        self._mitigation = MitigationState(run.mitigation_actions, run.entropy_coef_bonus,
                                           run.learning_rate_scale)
        if run.paused:
            state.status, state.paused_reason = RunState.paused, "paused before continue-as-new"
        try:
            await self._iterate(run, config)
        except asyncio.CancelledError:  # cancelled through Temporal rather than by a person
            await self._set_status(run.run_id, RunState.cancelled, "workflow cancelled in Temporal")
            raise
        except (ActivityError, NexusOperationError) as err:
            cause = err.cause if isinstance(err.cause, ApplicationError) else None
            message = cause.message if cause else str(err.cause or err)
            await self._set_status(run.run_id, RunState.failed, message[:2000])
            raise ApplicationError(message, type=cause.type if cause else "StepFailed",
                                   non_retryable=True) from err
        except ApplicationError as err:  # the run's own verdict (a rollout batch lost)
            await self._set_status(run.run_id, RunState.failed, err.message[:2000])
            raise
        return state

    async def _iterate(self, run: TrainingRunInput, config: RunConfig) -> None:
        state = self._state
        queue = workflow.info().task_queue
        plan = await m.VALIDATE_RUN.call(m.ValidateRunInput(
            run.run_id, run.submitted_by, list(config.rollout.task_ids)))
        if problems := curriculum_problems(config.rollout.curriculum,
                                           {t.task_id: t.tags for t in plan.tasks}):
            raise ApplicationError(
                f"training run {run.run_id} refused: its curriculum does not fit its tasks ("
                + "; ".join(problems) + ")", type="InvalidCurriculum", non_retryable=True)
        base = run.base_checkpoint_id or (await m.REGISTER_BASE_CHECKPOINT.call(
            m.RegisterBaseInput(run.run_id, config.model.base),
            task_queue=sibling_queue(queue, LEARNING_GPU_QUEUE))).checkpoint_id
        state.base_checkpoint_id = base
        latest = run.latest_checkpoint_id or base
        state.latest_checkpoint_id = latest
        if state.status != RunState.paused:
            await self._set_status(run.run_id, RunState.running, None)
        k, total = run.start_iteration, config.schedule.iterations
        # Rollouts in flight for iterations k+1, k+2, ... (at most asynchrony.staleness_window
        # ahead of the update; 1 = the one-step overlap).
        pending: deque[asyncio.Task[RolloutBatchResult]] = deque()
        window = config.asynchrony.staleness_window
        cycle_last = min(total, run.start_iteration + run.continue_as_new_every)
        while k < total and not self._cancelled:
            await self._wait_while_paused(run.run_id)
            if self._cancelled:
                break
            if not pending:
                pending.append(self._start_rollout(run, config, plan, k + 1, latest, version=k))
            batch = await self._await(run.run_id, pending[0])
            pending.popleft()
            if batch is None:
                break
            if (lost := lost_batch(batch)) is not None:
                await self._cancel_rollouts(pending)
                raise ApplicationError(lost, type="RolloutBatchLost", non_retryable=True)
            batch_ids = await self._resample(run, config, plan, k + 1, latest, k, batch)
            if batch_ids is None:
                break
            groups = self._plan_partial(config, batch)
            cycle_end = (k + 1 - run.start_iteration >= run.continue_as_new_every
                         or workflow.info().is_continue_as_new_suggested())
            if not (cycle_end or self._cancelled or state.status == RunState.paused):
                # Overlap: the next rollouts run with c_k while c_{k+1} is being trained.
                for iteration in rollouts_to_start(
                        next_iteration=k + 2 + len(pending), in_flight=len(pending),
                        window=window, last_iteration=cycle_last):
                    pending.append(self._start_rollout(run, config, plan, iteration, latest,
                                                       version=k))
            result = await self._await(run.run_id, self._start_update(
                run, config, plan, k + 1, latest, base, batch_ids, groups), cancellable=False)
            if result is None:
                break
            parent = latest
            k, latest = k + 1, result.checkpoint_id
            state.iterations_done, state.latest_checkpoint_id = k, latest
            state.last_reward_mean = result.reward_mean
            rolled_back_to = await self._after_update(run, config, result, parent)
            if rolled_back_to is not None:  # go on from before the alarm, with fresh rollouts
                latest = state.latest_checkpoint_id = rolled_back_to
                await self._cancel_rollouts(pending)
            if cycle_end and k < total and not self._cancelled:
                await self._cancel_rollouts(pending)  # only with a suggested early end
                await self._continue_as_new(run, k, latest, base)
        await self._cancel_rollouts(pending)
        if self._cancelled:
            state.status = RunState.cancelled
        elif k >= total:
            status, reason = completion(k, state)
            if config.advantage.zero_task_reward:
                reason = placebo_completion(reason, state.latest_checkpoint_id)
            state.status, state.paused_reason = status, None
            await self._set_status(run.run_id, status, reason[:2000])

    @staticmethod
    async def _cancel_rollouts(pending: deque[asyncio.Task[RolloutBatchResult]]) -> None:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        pending.clear()

    async def _after_update(self, run: TrainingRunInput, config: RunConfig,
                            result: m.UpdateResult, parent: str) -> str | None:
        """Alarms, mitigations and proposals after an update; a checkpoint to roll back to."""
        state = self._state
        rolled_back_to = None
        if result.alarms:
            messages = [f"iteration {result.iteration}: {a.message}" for a in result.alarms]
            state.alarms.extend(messages)
            state.alarms_raised += len(messages)
            rolled_back_to = await self._mitigate(run, config, result, parent, messages)
            if config.stability.pause_on_alarm and not self._cancelled:
                state.status, state.paused_reason = RunState.paused, "; ".join(messages)
                await self._set_status(run.run_id, RunState.paused, state.paused_reason[:2000],
                                       action="pause")
        # A placebo run trains the control, never a candidate: it proposes nothing.
        if result.iteration % config.schedule.propose_every == 0 and not self._cancelled \
                and not config.advantage.zero_task_reward:
            proposed = await m.PROPOSE_CHECKPOINT.call(m.ProposeInput(
                run.run_id, result.iteration, result.checkpoint_id, run.submitted_by,
                sibling_queue(workflow.info().task_queue, GOVERNANCE_QUEUE),
                state.base_checkpoint_id))
            # The proposal row is learning's; opening its promotion is governance's, asked
            # through governance's Nexus endpoint (learning cannot start its workflows).
            governance = workflow.create_nexus_client(
                service=GovernanceService,
                endpoint=endpoint_for(workflow.info().task_queue, "governance"))
            await governance.execute_operation(
                GovernanceService.propose_candidate, PromotionInput(
                    proposal_id=proposed.proposal_id, checkpoint_id=result.checkpoint_id,
                    run_id=run.run_id, submitted_by=run.submitted_by,
                    stability_alarms=proposed.stability_alarms),
                schedule_to_close_timeout=PROPOSAL_TIMEOUT)
            state.proposals.append(proposed.proposal_id)
        return rolled_back_to

    async def _mitigate(self, run: TrainingRunInput, config: RunConfig, result: m.UpdateResult,
                        parent: str, messages: list[str]) -> str | None:
        """Take the configured mitigation (audited first); the rollback target, if any."""
        if self._cancelled:
            return None
        action = decide_mitigation(
            config.mitigation, self._mitigation, alarmed=True,
            rollback_to=parent if parent != result.checkpoint_id else None)
        if action is None:
            return None
        await m.RECORD_MITIGATION.call(m.MitigationInput(
            run.run_id, result.iteration, action.kind, messages, dict(action.detail)))
        self._mitigation = action.state
        self._state.mitigations.append(f"iteration {result.iteration}: {action.kind}")
        return parent if action.kind == "rollback" else None

    async def _continue_as_new(self, run: TrainingRunInput, k: int, latest: str,
                               base: str) -> None:
        await self._handle_controls(run.run_id)  # signals are not carried over
        if self._cancelled:
            return
        workflow.continue_as_new(TrainingRunInput(
            run_id=run.run_id, submitted_by=run.submitted_by, config=run.config,
            start_iteration=k, latest_checkpoint_id=latest,
            paused=self._state.status == RunState.paused, base_checkpoint_id=base,
            continue_as_new_every=run.continue_as_new_every,
            update_heartbeat_timeout_s=run.update_heartbeat_timeout_s,
            alarms_raised=self._state.alarms_raised,
            task_pass_history=self._pass_history,
            mitigation_actions=self._mitigation.actions,
            entropy_coef_bonus=self._mitigation.entropy_coef_bonus,
            learning_rate_scale=self._mitigation.learning_rate_scale,
        ))

    async def _resample(self, run: TrainingRunInput, config: RunConfig, plan: m.RunPlan,
                        iteration: int, checkpoint_id: str, version: int,
                        batch: RolloutBatchResult) -> list[str] | None:
        """The iteration's batch ids, after dynamic sampling topped it up (None: cancelled).

        Extra groups run with the same checkpoint and version as the first batch, within
        ``sampling.max_resample_rounds`` extra batches.
        """
        self._note_pass_rates(config, batch)
        batch_ids = [batch.batch_id]
        tolerance = config.advantage.zero_variance_tolerance
        informative = informative_groups(batch, tolerance)
        drawn = config.rollout.groups_per_iteration
        while (missing := groups_to_resample(config, informative, len(batch_ids) - 1)) > 0:
            extra = await self._await(run.run_id, self._start_rollout(
                run, config, plan, iteration, checkpoint_id, version=version,
                groups=missing, offset=drawn, tag=f"r{len(batch_ids)}"))
            if extra is None:
                return None
            self._note_pass_rates(config, extra)
            batch_ids.append(extra.batch_id)
            informative += informative_groups(extra, tolerance)
            drawn += missing
        return batch_ids

    def _plan_partial(self, config: RunConfig, batch: RolloutBatchResult) -> GroupsOfUpdate:
        """Queue the batch's cut episodes for the next batch; the update's held/carried."""
        continued = self._batch_continued.pop(batch.batch_id, [])
        if not config.asynchrony.partial_rollouts:
            return GroupsOfUpdate([], [])
        decided = plan_continuations(
            batch.cut_episodes, items=self._batch_items, continuations=self._continuations,
            max_continuations=config.asynchrony.max_continuations)
        for position, episode in enumerate(continued):  # back: no longer in flight
            self._continuations.pop(
                continuation_episode_id(batch.batch_id, position, episode), None)
        batch_groups = [f"{batch.batch_id}:{index}"
                        for index in range(len(self._batch_items.get(batch.batch_id, [])))]
        decided, groups = settle(decided, continued, batch_groups)
        self._to_continue.extend(decided.continue_next)
        self._batch_series.setdefault(batch.batch_id, {}).update({
            "partial/continued": float(len(continued)),
            "partial/held_groups": float(len(groups.held)),
            "partial/carried_groups": float(len(groups.carried)),
            "partial/given_up": float(len(decided.given_up)),
        })
        return groups

    def _take_continuations(self, config: RunConfig, batch_id: str) -> list[ContinuedEpisode]:
        """The cut episodes the batch starting now continues (its first batch only)."""
        if not config.asynchrony.partial_rollouts or not self._to_continue:
            return []
        taken, self._to_continue = self._to_continue, []
        for position, episode in enumerate(taken):
            self._continuations[continuation_episode_id(batch_id, position, episode)] = episode
        self._batch_continued[batch_id] = taken
        return taken

    def _note_pass_rates(self, config: RunConfig, batch: RolloutBatchResult) -> None:
        if not config.sampling.pass_rate_filter:
            return  # nothing reads it: keep the continue-as-new input small
        items = self._batch_items.get(batch.batch_id, [])
        self._pass_history = record_pass_rates(self._pass_history, items, batch.batch_id,
                                               batch, config.sampling.pass_rate_window)

    def _start_rollout(self, run: TrainingRunInput, config: RunConfig, plan: m.RunPlan,
                       iteration: int, checkpoint_id: str, *, version: int,
                       groups: int | None = None, offset: int = 0, tag: str = ""
                       ) -> asyncio.Task[RolloutBatchResult]:
        rollout = config.rollout
        staged = curriculum_tasks(plan.tasks, iteration, config)
        tasks, filtered = tasks_for_sampling(staged, self._pass_history, config.sampling)
        count = groups or rollout.groups_per_iteration
        items = rollout_items(tasks, iteration, rollout.groups_per_iteration, rollout.group_size,
                              offset=offset, count=count)
        max_turns = max_turns_at(iteration, config)
        # The nonce (recorded in history) keeps the id from being requested first.
        batch_id = f"{run.run_id}-{iteration}{tag}-{workflow.uuid4().hex[:12]}"
        continued = [] if tag else self._take_continuations(config, batch_id)
        batch = RolloutBatchInput(
            batch_id=batch_id, purpose="training", items=items,
            continue_episodes=continued,
            checkpoint_id=checkpoint_id, run_id=run.run_id, policy_version=version,
            max_concurrency=min(MAX_ROLLOUT_CONCURRENCY,
                                count * rollout.group_size + len(continued)),
            deadline_s=rollout.deadline_s, temperature=rollout.temperature,
            heartbeat_timeout_s=rollout.heartbeat_timeout_s,
            max_turns=max_turns, max_new_tokens=rollout.max_new_tokens,
        )
        self._batch_items[batch.batch_id] = items
        # Only the keys of features the run uses: the run page charts every key.
        series: dict[str, float] = {}
        if config.sampling.pass_rate_filter:
            series["data/tasks_filtered"] = float(len(filtered))
        if max_turns is not None:
            series["curriculum/max_turns"] = float(max_turns)
        series.update(curriculum_series(iteration, config, len(staged)))
        self._batch_series[batch.batch_id] = series
        execution = workflow.create_nexus_client(
            service=ExecutionService, endpoint=endpoint_for(workflow.info().task_queue,
                                                            "execution"))
        task = asyncio.create_task(execution.execute_operation(
            ExecutionService.run_rollouts, batch,
            cancellation_type=workflow.NexusOperationCancellationType.TRY_CANCEL,
        ))
        self._rollout_checkpoints[task] = checkpoint_id
        return task

    def _served_by_rollouts(self) -> list[str]:
        """The checkpoints rollouts in flight are served from (finished ones let go)."""
        self._rollout_checkpoints = {task: checkpoint for task, checkpoint
                                     in self._rollout_checkpoints.items() if not task.done()}
        return sorted(set(self._rollout_checkpoints.values()))

    def _start_update(self, run: TrainingRunInput, config: RunConfig, plan: m.RunPlan,
                      iteration: int, parent: str, base: str, batch_ids: list[str],
                      groups: GroupsOfUpdate | None = None) -> asyncio.Task[m.UpdateResult]:
        series = dict(self._batch_series.pop(batch_ids[0], {}))
        for extra in batch_ids[1:]:
            self._batch_series.pop(extra, None)
        for batch_id in batch_ids:
            self._batch_items.pop(batch_id, None)
        if config.sampling.dynamic_sampling:
            series["dynamic_sampling/resample_rounds"] = float(len(batch_ids) - 1)
        mitigation = self._mitigation
        if mitigation.actions:
            series["mitigation/entropy_coef_bonus"] = mitigation.entropy_coef_bonus
            series["mitigation/learning_rate_scale"] = mitigation.learning_rate_scale
        return m.UPDATE_POLICY.start(m.UpdateInput(
                run_id=run.run_id, iteration=iteration, parent_checkpoint_id=parent,
                base_checkpoint_id=base, batch_ids=list(batch_ids), config=run.config,
                environment_version_ids=list(plan.environment_version_ids),
                task_environments={t.task_id: t.environment for t in plan.tasks},
                task_tags={t.task_id: dict(t.tags) for t in plan.tasks if t.tags},
                series=series, entropy_coef_bonus=mitigation.entropy_coef_bonus,
                learning_rate_scale=mitigation.learning_rate_scale,
                held_group_ids=list(groups.held) if groups else [],
                carried_group_ids=list(groups.carried) if groups else [],
                retain_checkpoint_ids=self._served_by_rollouts()),
            task_queue=sibling_queue(workflow.info().task_queue, LEARNING_GPU_QUEUE),
            heartbeat=timedelta(seconds=run.update_heartbeat_timeout_s),
        )

    async def _await(self, run_id: str, task: asyncio.Task[T], *, cancellable: bool = True
                     ) -> T | None:
        """The task's result, handling controls meanwhile; None if a cancel stopped it.

        An update is not cancellable: it stores its iteration when it finishes, so
        stopping it halfway would leave the workflow and the database disagreeing.
        """
        while True:
            await workflow.wait_condition(lambda: task.done() or bool(self._controls))
            await self._handle_controls(run_id)
            if task.done():
                return task.result()
            if self._cancelled and cancellable:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                return None

    async def _wait_while_paused(self, run_id: str) -> None:
        await self._handle_controls(run_id)
        while self._state.status == RunState.paused and not self._cancelled:
            await workflow.wait_condition(lambda: bool(self._controls))
            await self._handle_controls(run_id)

    async def _handle_controls(self, run_id: str) -> None:
        state = self._state
        while self._controls:
            action, control = self._controls.pop(0)
            paused = state.status == RunState.paused
            if self._cancelled or (action == "pause" and paused) or (
                action == "resume" and not paused
            ):
                continue  # nothing would change
            decision = await m.CONTROL_RUN.call(m.ControlInput(
                run_id, action, control.decision_id))
            if not decision.accepted:
                who = decision.user or f"decision {control.decision_id!r}"
                state.refused_controls.append(f"{action} by {who}: {decision.reason}")
                continue
            if action == "pause":
                reason = f": {decision.reason}" if decision.reason else ""
                state.status = RunState.paused
                state.paused_reason = f"paused by {decision.user}{reason}"
            elif action == "resume":
                state.status, state.paused_reason = RunState.running, None
            else:
                self._cancelled, state.status = True, RunState.cancelled

    async def _set_status(self, run_id: str, status: str, reason: str | None,
                          action: str = "update") -> None:
        self._state.status = status
        await m.SET_RUN_STATUS.call(m.RunStatusInput(run_id, status, reason, action))


@workflow.defn(name=MODEL_IMPORT_WORKFLOW)
class ModelImportWorkflow:
    """A person's model import: one activity on ``learning-gpu``, where checkpoints are
    written (the web service, which authorized the person, may start workflows here but
    holds no artifact store and inserts no checkpoint)."""

    @workflow.run
    async def run(self, request: ModelImportInput) -> ModelImportResult:
        """Import the model; its failure (a bad source, a taken name) is the workflow's."""
        return await m.IMPORT_MODEL.call(
            request, task_queue=sibling_queue(workflow.info().task_queue, LEARNING_GPU_QUEUE))
