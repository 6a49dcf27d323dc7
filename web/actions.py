"""What people do, shared by the JSON API and the console: authorize, check, then call a loop.

Each action asks the policy first, checks the resource's state, and refuses
(403/404/409/422) before it touches Temporal. The web role writes only the
training run row; every other change is a loop's, reached by start, signal or
update, and the loop re-checks the policy for the person.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, model_validator
from sqlmodel import Session

from triloop import held_out
from triloop.audit_anchor import ANCHOR_KEY, AnchorError
from triloop.curriculum import curriculum_problems
from triloop.episode_plan import batch_plan
from triloop.models import RolloutBatch
from triloop.models._columns import new_id
from triloop.placebo import is_placebo, placebo_config
from triloop.run_config import MAX_TASK_IDS, RunConfig, RunConfigError
from triloop.secrets import read_secret
from triloop.statuses import (
    Decision,
    DecisionKind,
    PromotionDecision,
    PromotionStatus,
    Purpose,
    TaskStatus,
)
from triloop.workflow_api import (
    RUN_CANCEL_SIGNAL,
    RUN_PAUSE_SIGNAL,
    RUN_RESUME_SIGNAL,
    DecisionRef,
    GateSummary,
    RollbackInput,
    RolloutBatchInput,
    RolloutItem,
    RunControl,
    TrainingRunInput,
    training_run_workflow_id,
)
from web.data import audit as audit_data
from web.data import (
    decisions,
    deployments,
    lineage,
    promotions,
    runs,
    task_set_refs,
    transcript_sample,
)
from web.data import environments as envs
from web.data.audit import ChainVerification
from web.data.deployments import RollbackPreview
from web.data.runs import RunSummary
from web.deps import Guard, Sessions, WebServices
from web.orchestration import PRODUCTION_BATCH_PREFIX
from web.problems import ProblemError, conflict, invalid, not_found
from web.run_submission import validate_run_config

RunAction = Literal["pause", "resume", "cancel"]
RUN_SIGNALS: dict[str, str] = {
    "pause": RUN_PAUSE_SIGNAL, "resume": RUN_RESUME_SIGNAL, "cancel": RUN_CANCEL_SIGNAL,
}
ALIAS_PATTERN = r"^[a-z][a-z0-9_-]{0,63}$"
# Whitespace as every engine involved agrees on it: the schema's regex (ECMA), pydantic's
# (Rust) and Python's ``str.strip`` each call a slightly different set "space", so a comment
# of U+001F alone was valid for the schema and refused by the server. One explicit set.
BLANK_CHARACTERS = (r"\t\n\u000b\f\r \u001c-\u001f\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029"
                    r"\u202f\u205f\u3000\ufeff")
NOT_BLANK = f"[^{BLANK_CHARACTERS}]"
Comment = Annotated[
    str, Field(min_length=1, max_length=4000, pattern=NOT_BLANK, description="required, non-blank")
]


def _json_object(value: Any) -> dict[str, Any]:
    # Checked in the validation pool (time-bounded, with every problem's path); here only
    # its shape, so that OpenAPI can show the RunConfig schema without FastAPI applying it.
    if not isinstance(value, dict):
        raise ValueError("RUN.yaml as JSON must be an object")
    return value


# A RUN.yaml as JSON, documented in OpenAPI with RunConfig's schema and field descriptions.
RunConfigJson = Annotated[dict[str, Any], PlainValidator(_json_object,
                                                         json_schema_input_type=RunConfig)]


class RunSubmit(BaseModel):
    """A RUN.yaml as a JSON object (``config``) or as YAML text (``config_yaml``): exactly one."""

    model_config = ConfigDict(json_schema_extra={
        "oneOf": [{"required": ["config"]}, {"required": ["config_yaml"]}],
    })
    config: RunConfigJson | None = Field(default=None, description="RUN.yaml as JSON")
    config_yaml: str | None = Field(default=None, max_length=200_000,
                                    description="RUN.yaml as text (YAML aliases refused)")


class RunControlRequest(BaseModel):
    """Why a run is paused, resumed or cancelled (optional)."""

    reason: str = Field(default="", max_length=2000)


class DecisionRequest(BaseModel):
    """A human decision needs a comment saying why."""

    comment: Comment


class DecisionOutcome(BaseModel):
    """What governance answered to a person's decision."""

    promotion_id: str
    action: PromotionDecision = Field(description="what the person decided (the policy's action)")
    decision: Decision = Field(description="the verb of the recorded human_decision row")
    user: str
    result: GateSummary = Field(description="the gate result governance recorded for it")


class DeploymentRollback(BaseModel):
    """Move this alias back to the last revision that was not rolled back, or a named one."""

    reason: Comment
    to_revision: int | None = Field(
        default=None, ge=1, le=2**31 - 1,
        description="return to this revision of the alias's history (refused if rolled back)")
    to_checkpoint_id: str | None = Field(
        default=None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$",
        description="return to this checkpoint's latest revision (refused if rolled back)")

    @model_validator(mode="after")
    def _one_target(self) -> DeploymentRollback:
        if self.to_revision is not None and self.to_checkpoint_id is not None:
            raise ValueError("name to_revision or to_checkpoint_id, not both")
        return self


class RollbackRequest(DeploymentRollback):
    """The deprecated ``POST /api/rollback`` body: the alias is a field, not the path."""

    alias: str = Field(default="production", pattern=ALIAS_PATTERN)


class RollbackOutcome(BaseModel):
    """Where the alias points after the rollback."""

    alias: str
    checkpoint_id: str
    previous_checkpoint_id: str
    workflow_id: str
    target_revision: int = Field(description="the revision returned to (0: not reported)")


class EpisodeItem(BaseModel):
    """Episodes of one admitted task from one seed."""

    task_id: str = Field(min_length=1, max_length=200)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    group_size: int = Field(default=1, ge=1, le=64)


class EpisodeRequest(BaseModel):
    """Production traffic: episodes served by whatever checkpoint routing names."""

    items: list[EpisodeItem] = Field(min_length=1, max_length=100)
    max_concurrency: int = Field(default=8, ge=1, le=64)
    deadline_s: float = Field(default=600.0, gt=0, le=86_400)


class EpisodesStarted(BaseModel):
    """The batch the execution loop is running."""

    batch_id: str
    workflow_id: str
    purpose: str
    episodes: int


async def _admitted(db: Sessions, task_ids: list[str]) -> None:
    tasks = await db.read(runs.tasks_by_id, task_ids=task_ids)
    problems = [f"{t}: no such task" for t in task_ids if t not in tasks]
    problems += [f"{t}: task is {tasks[t].status}, not admitted" for t in task_ids
                 if t in tasks and tasks[t].status != TaskStatus.admitted]
    if problems:
        raise invalid("every task must exist and be admitted", problems)


def _eval_overlaps(*, session: Session, task_ids: list[str]) -> list[str]:
    return [o.describe() for o in held_out.overlaps(
        session=session, training=task_ids, evaluation=held_out.frozen_eval_tasks(session))]


async def _held_out(db: Sessions, task_ids: list[str]) -> None:
    """A run may not train on what any frozen eval set judges candidates on."""
    problems = await db.read(_eval_overlaps, task_ids=task_ids)
    if problems:
        raise invalid("a run may not train on tasks an eval set holds out", problems)


def _training_splits(*, session: Session, config: RunConfig) -> tuple[list[str], list[str],
                                                                      list[str]]:
    """Each ``rollout.task_sets`` entry as its set's id and tasks, or its problem."""
    set_ids, task_ids, problems = [], [], []
    for i, chosen in enumerate(config.rollout.task_sets):
        found = task_set_refs.split_for(session=session, ref=chosen.task_set, split=chosen.split,
                                        allowed="train", use="a training run")
        if found.problem is not None:
            problems.append(f"rollout.task_sets[{i}]: {found.problem}")
        set_ids.append(found.task_set_id or chosen.task_set)
        task_ids += found.task_ids
    return set_ids, task_ids, problems


async def _resolve_task_sets(db: Sessions, config: RunConfig) -> RunConfig:
    """``rollout.task_sets`` resolved into ``rollout.task_ids`` (after any ids given), the
    sets named by id: the run stores what it trains on, whatever named it."""
    if not config.rollout.task_sets:
        return config
    set_ids, from_sets, problems = await db.read(_training_splits, config=config)
    if problems:
        raise invalid("rollout.task_sets names tasks a run may not train on", problems)
    task_ids = list(dict.fromkeys([*config.rollout.task_ids, *from_sets]))
    if len(task_ids) > MAX_TASK_IDS:
        raise invalid("the run names too many tasks", [
            f"rollout.task_sets: {len(task_ids)} tasks with rollout.task_ids; at most"
            f" {MAX_TASK_IDS}"])
    rollout = config.rollout.model_copy(update={
        "task_ids": task_ids,
        "task_sets": [chosen.model_copy(update={"task_set": set_id})
                      for chosen, set_id in zip(config.rollout.task_sets, set_ids, strict=True)],
    })
    return config.model_copy(update={"rollout": rollout})


async def submit_run(
    *, guard: Guard, db: Sessions, services: WebServices, body: RunSubmit
) -> RunSummary:
    """Validate a run, insert its row as the web role, and start it on the learning queue."""
    person = guard.principal
    await guard("submit", "training_run", owner=person.name)
    try:
        config = await services.validation.run(
            "the run configuration", validate_run_config, config=body.config,
            config_yaml=body.config_yaml,
        )
    except RunConfigError as exc:
        raise invalid("the run configuration is invalid",
                      [f"{p.path}: {p.message}" for p in exc.problems]) from exc
    task_ids, problems = await db.read(envs.resolve_task_refs,
                                       refs=list(config.rollout.task_ids))
    if problems:
        raise invalid("rollout.task_ids: a task id prefix names several tasks", problems)
    task_ids = list(dict.fromkeys(task_ids))  # two prefixes of one task name it once
    if task_ids != list(config.rollout.task_ids):  # the run stores full ids, as submitted
        config = config.model_copy(update={"rollout": config.rollout.model_copy(
            update={"task_ids": task_ids})})
    config = await _resolve_task_sets(db, config)
    task_ids, base = list(config.rollout.task_ids), config.model.base
    await _admitted(db, task_ids)
    await _held_out(db, task_ids)
    tasks = await db.read(runs.tasks_by_id, task_ids=task_ids)
    curriculum = curriculum_problems(config.rollout.curriculum,
                                     {t.id: dict(t.tags or {}) for t in tasks.values()})
    if curriculum:
        raise invalid("rollout.curriculum does not fit the run's tasks", curriculum)
    resolved = await db.read(lineage.resolve_base, ref=base)
    if resolved.problem is not None:
        raise invalid("model.base names no checkpoint", [resolved.problem])
    if resolved.checkpoint_id is not None:  # the run stores the id, whatever named it
        config = config.model_copy(update={"model": config.model.model_copy(
            update={"base": resolved.checkpoint_id})})
    run_id = new_id()
    workflow_id = training_run_workflow_id(run_id)
    row = await db.write(
        runs.insert_run, run_id=run_id, name=config.name, submitted_by=person.name,
        config=config.model_dump(mode="json"),
        base_checkpoint_id=resolved.checkpoint_id,
        environment_version_ids=sorted({t.environment_version_id for t in tasks.values()}),
        workflow_id=workflow_id,
    )
    try:
        await services.orchestrator.start_training_run(
            TrainingRunInput(run_id=run_id, submitted_by=person.name, config=config),
            workflow_id,
        )
    except ProblemError as exc:
        await db.write(runs.mark_failed, run_id=run_id, reason=f"not started: {exc.detail}")
        raise
    return RunSummary.model_validate(row)


async def submit_placebo(
    *, guard: Guard, db: Sessions, services: WebServices, run_id: str
) -> RunSummary:
    """Submit the placebo of one's own run: its stored config with the task reward zeroed
    (``triloop.placebo``), the same seed, named ``<name> (placebo)``; then as any submission.

    Refused: an unknown run (404), another person's run (the policy: people submit only
    their own runs), a run that is itself a placebo (409).
    """
    await guard.screen("submit", "training_run", id=run_id)
    row = await db.read(runs.get_run, run_id=run_id)
    if row is None:
        raise not_found("training run", run_id)
    await guard("submit", "training_run", id=run_id, owner=row.submitted_by)
    if is_placebo(row.config or {}):
        raise conflict(f"run {run_id} is itself a placebo (advantage.zero_task_reward); "
                       "submit the placebo of the run it controls for")
    try:
        config = placebo_config(row.config or {})
    except RunConfigError as exc:
        raise invalid(f"run {run_id}'s stored configuration is no longer valid",
                      [f"{p.path}: {p.message}" for p in exc.problems]) from exc
    return await submit_run(guard=guard, db=db, services=services,
                            body=RunSubmit(config=config))


async def control_run(
    *, guard: Guard, db: Sessions, services: WebServices, run_id: str, action: RunAction,
    reason: str,
) -> RunSummary:
    """Pause, resume or cancel one's own run (a signal to its workflow)."""
    await guard.screen(action, "training_run", id=run_id)
    row = await db.read(runs.get_run, run_id=run_id)
    if row is None:
        raise not_found("training run", run_id)
    run = RunSummary.model_validate(row)
    await guard(action, "training_run", id=run_id, owner=run.submitted_by)
    if run.status in runs.TERMINAL_STATUSES:
        raise conflict(f"run {run_id} is {run.status}; it can no longer be {action}d")
    if run.workflow_id is None:
        raise conflict(f"run {run_id} has no workflow yet; try again in a moment")
    decision_id = await db.write(
        decisions.record_decision, kind=DecisionKind.RUN_CONTROL, subject=run_id,
        decision=Decision(action), user=guard.principal.name, comment=reason,
        credential=guard.principal.credential)
    await services.orchestrator.signal_run(run.workflow_id, RUN_SIGNALS[action],
                                           RunControl(decision_id=decision_id))
    return run


async def decide_promotion(
    *, guard: Guard, db: Sessions, services: WebServices, promotion_id: str,
    decision: PromotionDecision, body: DecisionRequest,
) -> DecisionOutcome:
    """An auditor's sign-off or an operator's decision, sent as a Temporal update.

    ``decision`` is the one word for it all the way: the policy's action here, the recorded
    row's kind and verb, the gate whose update carries the row's id, and the action
    governance asks the policy again for. ``body`` was validated once, where it was parsed.
    """
    await guard.screen(decision, "promotion", id=promotion_id)
    facts = await db.read(promotions.decision_facts, promotion_id=promotion_id,
                          user=guard.principal.name)
    if facts is None:
        raise not_found("promotion", promotion_id)
    promotion = facts.promotion
    # With the role's age: refused here, before Temporal, what governance would refuse.
    await guard(decision, "promotion", id=promotion_id, attrs=facts.policy_attrs(decision))
    if promotion.status != PromotionStatus.open:
        raise conflict(f"promotion {promotion_id} is {promotion.status}; decisions need it open")
    if promotion.workflow_id is None:
        raise conflict(f"promotion {promotion_id} has no workflow to decide on")
    person = guard.principal
    details = (await audit_transcripts(db=db, promotion_id=promotion_id, user=person.name)
               if decision.kind == DecisionKind.AUDIT else None)
    decision_id = await db.write(
        decisions.record_decision, kind=decision.kind, subject=promotion_id,
        decision=decision.verb, user=person.name, comment=body.comment.strip(),
        credential=person.credential, details=details)
    result = await services.orchestrator.promotion_update(
        promotion.workflow_id, decision.gate, DecisionRef(decision_id=decision_id))
    return DecisionOutcome(promotion_id=promotion_id, action=decision, decision=decision.verb,
                           user=person.name, result=result)


async def audit_transcripts(*, db: Sessions, promotion_id: str, user: str) -> dict[str, Any]:
    """What an audit decision records about transcripts: the episodes of this promotion the
    auditor read (from their own access-log rows, never the client's word) and the sample
    the promotion page offered them."""
    shown = await db.read(transcript_sample.shown_transcripts, promotion_id=promotion_id,
                          user=user)
    sample = await db.read(transcript_sample.transcript_sample, promotion_id=promotion_id)
    return {"shown_transcripts": shown,
            "sampled_transcripts": sample.trajectory_ids if sample is not None else []}


async def rollback(
    *, guard: Guard, db: Sessions, services: WebServices, body: RollbackRequest
) -> RollbackOutcome:
    """Run governance's rollback workflow for an alias and wait for its result.

    The preview refuses early what governance would refuse (no revision to return to,
    a named revision that was rolled back); governance decides again under its lock.
    """
    await guard.screen("rollback", "deployment", id=body.alias)
    deployment = await db.read(deployments.get_deployment, alias=body.alias)
    if deployment is None:
        raise not_found("deployment alias", body.alias)
    await guard("rollback", "deployment", id=body.alias, attrs={
        "to_revision": body.to_revision, "to_checkpoint_id": body.to_checkpoint_id})
    preview = await preview_rollback(db=db, alias=body.alias, to_revision=body.to_revision,
                                     to_checkpoint_id=body.to_checkpoint_id)
    if preview.refusal is not None:
        raise conflict(preview.refusal)
    # The operator's decision, target included, is what governance reads and carries out.
    decision_id = await db.write(
        decisions.record_decision, kind=DecisionKind.ROLLBACK, subject=body.alias,
        decision=Decision.ROLLBACK, user=guard.principal.name, comment=body.reason.strip(),
        details={"to_revision": body.to_revision, "to_checkpoint_id": body.to_checkpoint_id},
        credential=guard.principal.credential)
    workflow_id = f"rollback-{body.alias}-{uuid.uuid4().hex[:12]}"
    request = RollbackInput(decision_id=decision_id, alias=body.alias)
    result = await services.orchestrator.rollback(request, workflow_id,
                                                  user=guard.principal.name)
    return RollbackOutcome(alias=result.alias, checkpoint_id=result.checkpoint_id,
                           previous_checkpoint_id=result.previous_checkpoint_id,
                           workflow_id=workflow_id, target_revision=result.target_revision)


async def preview_rollback(
    *, db: Sessions, alias: str, to_revision: int | None = None,
    to_checkpoint_id: str | None = None,
) -> RollbackPreview:
    """What a rollback of the alias would do, changing nothing (the caller authorized it)."""
    preview = await db.read(deployments.rollback_preview, alias=alias, to_revision=to_revision,
                            to_checkpoint_id=to_checkpoint_id)
    if preview is None:
        raise not_found("deployment alias", alias)
    return preview


class AdmissionRequest(BaseModel):
    """An operator admits an assessed task (only an admissible one) or rejects it."""

    decision: Literal[Decision.APPROVE, Decision.REJECT]
    comment: Comment


class AdmissionOutcome(BaseModel):
    """The task's admission as governance left it."""

    task_id: str
    status: str
    admissible: bool | None = None
    reasons: list[str] = Field(default_factory=list)
    decided_by: str | None = None


async def decide_admission(
    *, guard: Guard, db: Sessions, services: WebServices, task_id: str, body: AdmissionRequest
) -> AdmissionOutcome:
    """Record the operator's decision, then hand its id to the task's admission workflow."""
    tasks = await db.read(runs.tasks_by_id, task_ids=[task_id])
    if task_id not in tasks:
        raise not_found("task", task_id)
    await guard("admit" if body.decision == Decision.APPROVE else "reject_task", "task",
                id=task_id)
    if tasks[task_id].status != TaskStatus.pending:
        raise conflict(f"task {task_id} is already {tasks[task_id].status}")
    decision_id = await db.write(
        decisions.record_decision, kind=DecisionKind.ADMISSION, subject=task_id,
        decision=Decision(body.decision), user=guard.principal.name,
        comment=body.comment.strip(), credential=guard.principal.credential)
    result = await services.orchestrator.admission_update(task_id, DecisionRef(decision_id))
    return AdmissionOutcome(task_id=task_id, status=result.status,
                            admissible=result.admissible, reasons=list(result.reasons),
                            decided_by=result.decided_by)


class TaskSetAdmissionOutcome(BaseModel):
    """A task set's admission as governance left it: the sample's verdict and the decision."""

    task_set_id: str
    status: str
    admissible: bool | None = None
    members: int = 0
    sample_size: int = 0
    sample_seed: int = 0
    failures: list[str] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    decided_by: str | None = None


async def decide_task_set_admission(
    *, guard: Guard, db: Sessions, services: WebServices, ref: str, body: AdmissionRequest
) -> TaskSetAdmissionOutcome:
    """Record the operator's one decision on a task set (its id, a unique id prefix or
    NAME@V), then hand its id to the set's admission workflow, which sets every member."""
    found = await db.read(task_set_refs.find_task_set, ref=ref)
    if found.task_set is None:
        raise not_found("task set", ref)
    task_set = found.task_set
    admit = body.decision == Decision.APPROVE
    await guard("admit" if admit else "reject", "task_set", id=task_set.id)
    if task_set.status != TaskStatus.pending:
        raise conflict(f"task set {task_set.id} is already {task_set.status}")
    evidence = task_set.evidence or {}
    admissible = evidence.get("admissible")
    if admissible is None:  # nothing to decide on yet, either way
        raise conflict(f"task set {task_set.id} has not been assessed yet; wait for its"
                       " admission's evidence")
    if admit and admissible is not True:
        failures = "; ".join(evidence.get("failures") or [])
        raise conflict(f"task set {task_set.id} is not admissible; it can only be rejected"
                       f" (failures: {failures})")
    decision_id = await db.write(
        decisions.record_decision, kind=DecisionKind.TASK_SET_ADMISSION, subject=task_set.id,
        decision=Decision(body.decision), user=guard.principal.name,
        comment=body.comment.strip(), credential=guard.principal.credential)
    result = await services.orchestrator.task_set_admission_update(task_set.id,
                                                                   DecisionRef(decision_id))
    return TaskSetAdmissionOutcome(
        task_set_id=result.task_set_id, status=result.status, admissible=result.admissible,
        members=result.members, sample_size=result.sample_size, sample_seed=result.sample_seed,
        failures=list(result.failures), reasons=list(result.reasons),
        decided_by=result.decided_by)


def record_production_batch(*, session: Session, batch: RolloutBatchInput) -> None:
    """The ``rollout_batch`` row of people's production traffic (routing picks checkpoints),
    naming the episodes it plans: execution stores no others in it."""
    session.add(RolloutBatch(id=batch.batch_id, purpose=Purpose.PRODUCTION, requested_by="web",
                             planned_episodes=batch_plan(batch)))


async def start_episodes(
    *, guard: Guard, db: Sessions, services: WebServices, body: EpisodeRequest
) -> EpisodesStarted:
    """Production episodes on the execution queue, served by governance's routing."""
    await guard("create", "trajectory", attrs={"purpose": Purpose.PRODUCTION})
    await _admitted(db, list(dict.fromkeys(item.task_id for item in body.items)))
    await _room_for_production(services)
    batch_id = new_id()
    workflow_id = f"{PRODUCTION_BATCH_PREFIX}{batch_id}"
    batch = RolloutBatchInput(
        batch_id=batch_id, purpose=Purpose.PRODUCTION,
        items=[RolloutItem(task_id=i.task_id, seed=i.seed, group_size=i.group_size)
               for i in body.items],
        max_concurrency=body.max_concurrency, deadline_s=body.deadline_s,
    )
    # The batch's row says people asked for it: execution stores its episodes only then.
    await db.write(record_production_batch, batch=batch)
    await services.orchestrator.start_episodes(batch, workflow_id)
    return EpisodesStarted(batch_id=batch_id, workflow_id=workflow_id, purpose=Purpose.PRODUCTION,
                           episodes=sum(i.group_size for i in body.items))


async def _room_for_production(services: WebServices) -> None:
    """Backpressure: refuse (429) a batch while the bound of batches in flight is reached, so
    production traffic cannot pile up workflows ahead of governance's eval batches."""
    limit = services.settings.max_production_batches_in_flight
    running = await services.orchestrator.production_batches_in_flight()
    if running >= limit:
        retry = services.settings.production_retry_after_s
        raise ProblemError(
            429, "Too many requests",
            f"{running} production batches are running and the bound is {limit}"
            " (TRILOOP_MAX_PRODUCTION_BATCHES_IN_FLIGHT); send this batch again in"
            f" {retry} s", headers={"Retry-After": str(retry)})


async def verify_audit(*, guard: Guard, services: WebServices,
                       anchors: list[str] | None = None) -> ChainVerification:
    """Recompute the audit chain's hashes; with ``anchors`` (lines ``triloop audit anchor``
    signed), also check that the chain still holds each one."""
    await guard("verify", "audit_event")
    if anchors is None:
        return await asyncio.to_thread(audit_data.verify, services.engine)
    key = read_secret(services.settings.secrets, ANCHOR_KEY)
    if key is None:
        raise conflict(f"the web service holds no anchor key ({services.settings.secrets}/"
                       f"{ANCHOR_KEY}): anchors are checked where `triloop audit anchor` signed"
                       " them; verify without --anchor-file, or give the service that key")
    try:
        return await asyncio.to_thread(audit_data.verify, services.engine, anchors=anchors,
                                       key=key)
    except AnchorError as error:
        raise invalid(f"anchors: {error}") from error

