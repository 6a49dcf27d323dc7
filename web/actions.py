"""What people do, shared by the JSON API and the console: authorize, check, then call a loop.

Each action asks the policy first, checks the resource's state, and refuses
(403/404/409/422) before it touches Temporal. The web role writes only the
training run row; every other change is a loop's, reached by start, signal or
update, and the loop re-checks the policy for the person.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from dataclasses import asdict, is_dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from triloop.models._columns import new_id
from triloop.workflow_api import (
    PROMOTION_APPROVE_UPDATE,
    PROMOTION_SIGN_AUDIT_UPDATE,
    RUN_CANCEL_SIGNAL,
    RUN_PAUSE_SIGNAL,
    RUN_RESUME_SIGNAL,
    HumanDecision,
    RollbackInput,
    RolloutBatchInput,
    RolloutItem,
    RunControl,
    TrainingRunInput,
    training_run_workflow_id,
)
from web.data import audit as audit_data
from web.data import deployments, promotions, runs
from web.data.audit import ChainVerification
from web.data.runs import RunSummary
from web.deps import Guard, Sessions, WebServices
from web.problems import ProblemError, conflict, invalid, not_found
from web.run_submission import RunConfigInvalid, validate_run_config

RunAction = Literal["pause", "resume", "cancel"]
PromotionAction = Literal["sign_audit", "reject_audit", "approve", "reject"]
RUN_SIGNALS: dict[str, str] = {
    "pause": RUN_PAUSE_SIGNAL, "resume": RUN_RESUME_SIGNAL, "cancel": RUN_CANCEL_SIGNAL,
}
# action -> (update name, HumanDecision.decision)
PROMOTION_UPDATES: dict[str, tuple[str, str]] = {
    "sign_audit": (PROMOTION_SIGN_AUDIT_UPDATE, "approve"),
    "reject_audit": (PROMOTION_SIGN_AUDIT_UPDATE, "reject"),
    "approve": (PROMOTION_APPROVE_UPDATE, "approve"),
    "reject": (PROMOTION_APPROVE_UPDATE, "reject"),
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


class RunSubmit(BaseModel):
    """A RUN.yaml as a JSON object (``config``) or as YAML text (``config_yaml``): exactly one."""

    model_config = ConfigDict(json_schema_extra={
        "oneOf": [{"required": ["config"]}, {"required": ["config_yaml"]}],
    })
    config: dict[str, Any] | None = Field(default=None, description="RUN.yaml as JSON")
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
    action: str
    decision: str
    user: str
    result: Any = Field(default=None, description="the promotion workflow's update result")


class RollbackRequest(BaseModel):
    """Move an alias back to its rollback target."""

    alias: str = Field(default="production", pattern=ALIAS_PATTERN)
    reason: Comment


class RollbackOutcome(BaseModel):
    """Where the alias points after the rollback."""

    alias: str
    checkpoint_id: str
    previous_checkpoint_id: str
    workflow_id: str


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
                 if t in tasks and tasks[t].status != "admitted"]
    if problems:
        raise invalid("every task must exist and be admitted", problems)


async def submit_run(
    *, guard: Guard, db: Sessions, services: WebServices, body: RunSubmit
) -> RunSummary:
    """Validate a run, insert its row as the web role, and start it on the learning queue."""
    person = guard.principal
    await guard("submit", "training_run", owner=person.name)
    try:
        valid = await services.validation.run(
            "the run configuration", validate_run_config, config=body.config,
            config_yaml=body.config_yaml,
        )
    except RunConfigInvalid as exc:
        raise invalid("the run configuration is invalid", exc.problems) from exc
    await _admitted(db, valid.task_ids)
    tasks = await db.read(runs.tasks_by_id, task_ids=valid.task_ids)
    base_is_checkpoint = await db.read(runs.checkpoint_exists, checkpoint_id=valid.base)
    run_id = new_id()
    workflow_id = training_run_workflow_id(run_id)
    row = await db.write(
        runs.insert_run, run_id=run_id, name=valid.name, submitted_by=person.name,
        config=valid.config, base_checkpoint_id=valid.base if base_is_checkpoint else None,
        environment_version_ids=sorted({t.environment_version_id for t in tasks.values()}),
        workflow_id=workflow_id,
    )
    try:
        await services.orchestrator.start_training_run(
            TrainingRunInput(run_id=run_id, submitted_by=person.name, config=valid.config),
            workflow_id,
        )
    except ProblemError as exc:
        await db.write(runs.mark_failed, run_id=run_id, reason=f"not started: {exc.detail}")
        raise
    return RunSummary.model_validate(row)


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
    control = RunControl(user=guard.principal.name, reason=reason)
    await services.orchestrator.signal_run(run.workflow_id, RUN_SIGNALS[action], control)
    return run


async def decide_promotion(
    *, guard: Guard, db: Sessions, services: WebServices, promotion_id: str,
    action: PromotionAction, comment: str,
) -> DecisionOutcome:
    """An auditor's sign-off or an operator's decision, sent as a Temporal update."""
    await guard.screen(action, "promotion", id=promotion_id)
    facts = await db.read(promotions.decision_facts, promotion_id=promotion_id)
    if facts is None:
        raise not_found("promotion", promotion_id)
    promotion = facts.promotion
    attrs = {"submitted_by": promotion.submitted_by}
    if facts.audited_by:
        attrs["audited_by"] = facts.audited_by
    await guard(action, "promotion", id=promotion_id, attrs=attrs)
    if not re.search(NOT_BLANK, comment):
        raise invalid("a comment saying why is required")
    if promotion.status != "open":
        raise conflict(f"promotion {promotion_id} is {promotion.status}; decisions need it open")
    if promotion.workflow_id is None:
        raise conflict(f"promotion {promotion_id} has no workflow to decide on")
    update, decision = PROMOTION_UPDATES[action]
    person = guard.principal
    human = HumanDecision(user=person.name, roles=list(person.roles), decision=decision,
                          comment=comment.strip())
    result = await services.orchestrator.promotion_update(promotion.workflow_id, update, human)
    return DecisionOutcome(promotion_id=promotion_id, action=action, decision=decision,
                           user=person.name, result=_plain(result))


async def rollback(
    *, guard: Guard, db: Sessions, services: WebServices, body: RollbackRequest
) -> RollbackOutcome:
    """Run governance's rollback workflow for an alias and wait for its result."""
    await guard.screen("rollback", "deployment", id=body.alias)
    deployment = await db.read(deployments.get_deployment, alias=body.alias)
    if deployment is None:
        raise not_found("deployment alias", body.alias)
    await guard("rollback", "deployment", id=body.alias)
    if deployment.rollback_target_id is None:
        raise conflict(f"alias {body.alias} has no rollback target")
    person = guard.principal
    workflow_id = f"rollback-{body.alias}-{uuid.uuid4().hex[:12]}"
    request = RollbackInput(requested_by=person.name, reason=body.reason.strip(),
                            alias=body.alias, roles=list(person.roles))
    result = await services.orchestrator.rollback(request, workflow_id)
    return RollbackOutcome(alias=result.alias, checkpoint_id=result.checkpoint_id,
                           previous_checkpoint_id=result.previous_checkpoint_id,
                           workflow_id=workflow_id)


async def start_episodes(
    *, guard: Guard, db: Sessions, services: WebServices, body: EpisodeRequest
) -> EpisodesStarted:
    """Production episodes on the execution queue, served by governance's routing."""
    await guard("create", "trajectory", attrs={"purpose": "production"})
    await _admitted(db, list(dict.fromkeys(item.task_id for item in body.items)))
    batch_id = new_id()
    workflow_id = f"episodes-{batch_id}"
    batch = RolloutBatchInput(
        batch_id=batch_id, purpose="production",
        items=[RolloutItem(task_id=i.task_id, seed=i.seed, group_size=i.group_size)
               for i in body.items],
        max_concurrency=body.max_concurrency, deadline_s=body.deadline_s,
    )
    await services.orchestrator.start_episodes(batch, workflow_id)
    return EpisodesStarted(batch_id=batch_id, workflow_id=workflow_id, purpose="production",
                           episodes=sum(i.group_size for i in body.items))


async def verify_audit(*, guard: Guard, services: WebServices) -> ChainVerification:
    """Recompute the audit chain's hashes."""
    await guard("verify", "audit_event")
    return await asyncio.to_thread(audit_data.verify, services.engine)


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if value is None or isinstance(value, str | int | float | bool | list | dict):
        return value
    return str(value)
