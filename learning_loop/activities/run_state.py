"""Light activities on the ``learning`` queue: a run's checks, status, controls and proposals.

Every write asks ``authorize()`` first as ``Actor(service="learning")``. A person's
pause/resume/cancel reached the workflow as a signal the web service sent after the
policy allowed it; here the policy is asked again for that person (``on_behalf_of``,
roles read from ``app_user``), so a signal from anywhere else changes nothing.

Proposing is the learning loop's only step towards production: a ``proposal`` row, which
the workflow then hands to governance's ``propose_candidate`` Nexus operation. Everything
after that (eval, gates, promotion) is governance's, under its own identity.
"""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy import Engine
from sqlmodel import Session
from temporalio import activity
from temporalio.exceptions import ApplicationError

from learning_loop.contracts import (
    CONTROL_RUN,
    PROPOSE_CHECKPOINT,
    RECORD_MITIGATION,
    RUN_NOT_FOUND,
    SET_RUN_STATUS,
    TASK_NOT_ADMITTED,
    VALIDATE_RUN,
    ControlDecision,
    ControlInput,
    MitigationInput,
    MitigationRecorded,
    ProposeInput,
    ProposeResult,
    RunPlan,
    RunStatusInput,
    TaskSeed,
    ValidateRunInput,
)
from learning_loop.store import (
    get_run,
    get_tasks,
    insert_proposal,
    recorded_alarms,
    reward_history,
    set_run_status,
)
from triloop.audit import record_event
from triloop.db import session_scope
from triloop.decisions import DecisionRefused, audit_refusal, current_execution, load_decision
from triloop.models import DecisionKind, EnvironmentVersion, Proposal
from triloop.policy import Actor, Authorizer, PolicyDenied, Resource, acting_for
from triloop.statuses import Decision, RunStatus
from triloop.workflow_api import (
    ErrorType,
    StabilityAlarm,
    promotion_workflow_id,
)

LEARNING = Actor(service="learning")
# What a person's run control makes of the run.
CONTROL_STATUS: dict[str, RunStatus] = {
    Decision.PAUSE: RunStatus.paused, Decision.RESUME: RunStatus.running,
    Decision.CANCEL: RunStatus.cancelled,
}
_PROPOSAL_NAMESPACE = uuid.UUID("8f7d2a43-5a55-4f43-9a59-0c6f3b1d7e21")


def proposal_id_for(run_id: str, iteration: int) -> str:
    """The proposal id of a run's iteration: fixed, so a retried proposal is the same one."""
    return uuid.uuid5(_PROPOSAL_NAMESPACE, f"{run_id}/{iteration}").hex


class RunActivities:
    """The run's bookkeeping, bound to the learning role's engine, OPA and Temporal."""

    def __init__(self, *, engine: Engine, authorizer: Authorizer) -> None:
        self._engine = engine
        self._authorizer = authorizer

    @activity.defn(name=VALIDATE_RUN.name)
    def validate_run(self, request: ValidateRunInput) -> RunPlan:
        """The run's row exists as submitted and every task is admitted on a live version."""
        run = get_run(engine=self._engine, run_id=request.run_id)
        if run is None or run.submitted_by != request.submitted_by:
            found = "no row" if run is None else f"a row submitted by {run.submitted_by!r}"
            raise ApplicationError(
                f"training run {request.run_id} has {found}; runs are submitted through"
                " POST /api/runs or `triloop train submit`, which record the submitter",
                type=RUN_NOT_FOUND, non_retryable=True,
            )
        if not request.task_ids:  # task sets are resolved to ids by the web service
            raise ApplicationError(
                f"training run {request.run_id} refused: it names no task ids; the web service"
                " resolves rollout.task_sets into rollout.task_ids when the run is submitted",
                type=TASK_NOT_ADMITTED, non_retryable=True,
            )
        tasks = get_tasks(engine=self._engine, task_ids=request.task_ids)
        problems = [f"task {t} does not exist" for t in request.task_ids if t not in tasks]
        problems += [
            f"task {t} is {tasks[t].status}, not admitted" for t in request.task_ids
            if t in tasks and tasks[t].status != "admitted"
        ]
        environments: dict[str, str] = {}
        with Session(self._engine) as session:
            for task_id in request.task_ids:
                task = tasks.get(task_id)
                version = session.get(EnvironmentVersion, task.environment_version_id) if task \
                    else None
                if version is not None:
                    environments[task_id] = version.environment_name
                if version is not None and version.retired_at is not None:
                    problems.append(f"task {task_id} is on retired environment version"
                                    f" {version.id[:12]}")
        if problems:
            raise ApplicationError(
                f"training run {request.run_id} refused: it may train only on tasks governance"
                f" admitted ({'; '.join(problems)}); ask for admission (AdmissionWorkflow) or"
                " remove them from rollout.task_ids",
                type=TASK_NOT_ADMITTED, non_retryable=True,
            )
        ordered = [tasks[t] for t in request.task_ids]
        return RunPlan(
            tasks=[TaskSeed(t.id, t.seed, t.environment_version_id, environments.get(t.id, ""),
                            tags={str(k): str(v) for k, v in (t.tags or {}).items()})
                   for t in ordered],
            environment_version_ids=sorted({t.environment_version_id for t in ordered}),
        )

    @activity.defn(name=SET_RUN_STATUS.name)
    def set_run_status(self, request: RunStatusInput) -> None:
        """Record the run's status on its row (``update``; ``pause`` for an alarm's pause)."""
        self._authorizer.authorize(LEARNING, request.action, Resource(
            "training_run", id=request.run_id, attrs={"status": request.status}
        ), context={"reason": request.reason} if request.reason else None)
        set_run_status(engine=self._engine, run_id=request.run_id, status=request.status,
                       reason=request.reason)

    @activity.defn(name=CONTROL_RUN.name)
    def control_run(self, request: ControlInput) -> ControlDecision:
        """Carry out a person's recorded pause/resume/cancel if the policy allows it."""
        if request.action not in CONTROL_STATUS:
            return ControlDecision(False, f"unknown run control {request.action!r}")
        run = get_run(engine=self._engine, run_id=request.run_id)
        if run is None:
            return ControlDecision(False, f"training run {request.run_id} has no row")
        resource = Resource("training_run", id=request.run_id, owner=run.submitted_by)
        try:
            with session_scope(self._engine) as session:  # used once, before it acts
                proven = load_decision(session, decision_id=request.decision_id,
                                       kind=DecisionKind.RUN_CONTROL, subject=request.run_id,
                                       execution=current_execution())
            if proven.decision != request.action:
                raise DecisionRefused(
                    f"decision {proven.id} asks to {proven.decision}, not to {request.action}")
        except DecisionRefused as exc:
            audit_refusal(self._engine, service=LEARNING.service, action=request.action,
                          resource=resource.to_input(), decision_id=request.decision_id,
                          reason=str(exc))
            activity.logger.warning("run control refused: %s", exc)
            return ControlDecision(False, str(exc))
        try:
            self._authorizer.authorize(
                LEARNING, request.action, resource,
                context=acting_for(proven.person, reason=proven.comment,
                                   human_decision_id=proven.id),
            )
        except PolicyDenied as denied:
            activity.logger.warning("run control refused: %s", denied)
            return ControlDecision(False, str(denied), proven.user)
        reason = f"{request.action} by {proven.user}" + (
            f": {proven.comment}" if proven.comment else "")
        set_run_status(engine=self._engine, run_id=request.run_id,
                       status=CONTROL_STATUS[request.action], reason=reason)
        return ControlDecision(True, proven.comment, proven.user)

    @activity.defn(name=RECORD_MITIGATION.name)
    def record_mitigation(self, request: MitigationInput) -> MitigationRecorded:
        """Authorize a mitigation as an update of the run, then audit it on the run.

        A refusal (PolicyDenied) is non-retryable: the workflow then fails rather than
        change its training without a record.
        """
        resource = Resource("training_run", id=request.run_id, attrs={
            "mitigation": request.kind, "iteration": request.iteration})
        try:
            self._authorizer.authorize(LEARNING, "update", resource)
        except PolicyDenied as denied:
            raise ApplicationError(str(denied), type=ErrorType.POLICY_DENIED, non_retryable=True) \
                from denied
        record_event(
            self._engine, actor=LEARNING.to_input(), action="stability_mitigation",
            resource={"kind": "training_run", "id": request.run_id, "attrs": {}},
            payload={"iteration": request.iteration, "kind": request.kind,
                     "alarms": list(request.alarms), "detail": dict(request.detail)},
        )
        return MitigationRecorded()

    @activity.defn(name=PROPOSE_CHECKPOINT.name)
    async def propose_checkpoint(self, request: ProposeInput) -> ProposeResult:
        """Write the proposal row; the workflow then hands it to governance through Nexus."""
        proposal_id = proposal_id_for(request.run_id, request.iteration)
        alarms = await asyncio.to_thread(self._record_proposal, request, proposal_id)
        return ProposeResult(proposal_id, promotion_workflow_id(proposal_id),
                             stability_alarms=alarms)

    def _record_proposal(self, request: ProposeInput, proposal_id: str
                         ) -> list[StabilityAlarm]:
        """Write the proposal row; returns the run's stability alarms it carries."""
        self._authorizer.authorize(LEARNING, "propose", Resource(
            "proposal", id=proposal_id,
            attrs={"checkpoint_id": request.checkpoint_id, "run_id": request.run_id,
                   "iteration": request.iteration, "submitted_by": request.submitted_by},
        ))
        alarms = [StabilityAlarm(iteration, kind) for iteration, kind in recorded_alarms(
            engine=self._engine, run_id=request.run_id, up_to=request.iteration)]
        evidence = {
            "iteration": request.iteration,
            "base_checkpoint_id": request.base_checkpoint_id,
            "reward_mean_by_iteration": [
                [i, r] for i, r in reward_history(engine=self._engine, run_id=request.run_id)
            ],
            # Governance refuses a candidate whose run alarmed recently (unless an operator
            # overrides), and checks this list against the run's stored alarms.
            "stability_alarms": [{"iteration": a.iteration, "kind": a.kind} for a in alarms],
        }
        insert_proposal(engine=self._engine, proposal=Proposal(
            id=proposal_id, checkpoint_id=request.checkpoint_id, run_id=request.run_id,
            submitted_by=request.submitted_by, evidence=evidence,
        ))
        return alarms
