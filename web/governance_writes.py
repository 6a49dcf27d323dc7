"""What people write to governance's versioned data: environment versions, eval sets, thresholds.

The same path as every other decision (``web.actions``): authorize the person, check the
content, record a ``human_decision`` (only the web role may), then run governance's
``GovernanceWriteWorkflow`` with the row's id. Governance proves the row, asks OPA for the
person again and writes; the web role writes nothing else. What the web service can check
is refused (422, every problem named) before any row is recorded: a contract's problems,
tasks that are not admitted. What only governance can check (a threshold spec, held-out
tasks) comes back from governance as a 422 too, with the decision on record and nothing
else written.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from triloop.contract_upload import upload_problems
from triloop.statuses import Decision, DecisionKind
from triloop.workflow_api import (
    GovernanceWriteInput,
    GovernanceWriteResult,
    governance_write_workflow_id,
)
from web.actions import _admitted
from web.data import decisions, task_set_refs
from web.deps import Guard, Sessions, WebServices
from web.problems import invalid

ENVIRONMENT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
VERSIONED_NAME = ENVIRONMENT_NAME  # eval sets and thresholds are named the same way
ID = r"^[A-Za-z0-9_.:-]{1,200}$"
MAX_EVAL_TASKS = 1000


class EnvironmentRegistration(BaseModel):
    """A contract to register as its environment's next version, as its files would be."""

    name: str = Field(pattern=ENVIRONMENT_NAME,
                      description="the environment's name (the CLI uses the contract's task)")
    contract_yaml: str = Field(min_length=1, max_length=200_000,
                               description="the contract file's text (YAML aliases refused)")
    fixtures: dict[str, str] = Field(
        default_factory=dict, max_length=500,
        description="each fixture file the contract lists: path relative to the contract ->"
                    " its bytes in base64")
    comment: str = Field(default="", max_length=2000, description="why (optional)")


class EnvironmentRegistered(BaseModel):
    """The version governance stored (or the one that already holds identical content)."""

    version_id: str
    environment: str
    version: int
    created: bool = Field(description="false: identical content was already registered")
    decision_id: str = Field(description="the recorded human_decision governance acted on")
    workflow_id: str


async def register_environment(
    *, guard: Guard, db: Sessions, services: WebServices, body: EnvironmentRegistration
) -> EnvironmentRegistered:
    """Check the contract, record the operator's decision and have governance register it."""
    await guard("create", "environment_version", attrs={"environment": body.name})
    problems = await services.validation.run(
        "the contract", upload_problems, contract_yaml=body.contract_yaml,
        fixtures=body.fixtures)
    if problems:
        raise invalid(f"the contract has {len(problems)} problem(s)",
                      [str(p) for p in problems])
    decision_id, workflow_id, result = await _decide(
        guard=guard, db=db, services=services, kind=DecisionKind.ENVIRONMENT_VERSION,
        subject=body.name, decision=Decision.REGISTER, comment=body.comment,
        details={"contract_yaml": body.contract_yaml, "fixtures": body.fixtures})
    return EnvironmentRegistered(version_id=result.id, environment=result.name,
                                 version=result.version, created=result.created,
                                 decision_id=decision_id, workflow_id=workflow_id)


async def _decide(
    *, guard: Guard, db: Sessions, services: WebServices, kind: DecisionKind, subject: str,
    decision: Decision, comment: str, details: dict[str, Any],
) -> tuple[str, str, GovernanceWriteResult]:
    """Record the person's decision, then run governance's write on it to the end."""
    decision_id = await db.write(
        decisions.record_decision, kind=kind, subject=subject, decision=decision,
        user=guard.principal.name, comment=comment.strip(), details=details,
        credential=guard.principal.credential)
    workflow_id = governance_write_workflow_id(decision_id)
    result = await services.orchestrator.governance_write(
        GovernanceWriteInput(decision_id=decision_id, kind=kind.value, subject=subject),
        workflow_id, user=guard.principal.name)
    return decision_id, workflow_id, result


class EvalSetFreeze(BaseModel):
    """The next version of an eval set, frozen at once: from admitted tasks, or from the
    eval split of an admitted task set (``from_task_set``, ``split: eval``)."""

    name: str = Field(pattern=VERSIONED_NAME, description="the eval set's name")
    task_ids: list[Annotated[str, Field(pattern=ID)]] | None = Field(
        default=None, min_length=1, max_length=MAX_EVAL_TASKS,
        description="admitted tasks, in order, each once (or from_task_set)")
    from_task_set: str | None = Field(
        default=None, min_length=1, max_length=200,
        description="an admitted task set (id, unique id prefix, NAME@V or NAME) whose eval"
                    " split, in the set's order, becomes the eval set's tasks")
    split: Literal["train", "eval", "traffic"] = Field(
        default="eval", description="with from_task_set: the split, which must be eval")
    comment: str = Field(default="", max_length=2000, description="why (optional)")

    @model_validator(mode="after")
    def _one_source(self) -> EvalSetFreeze:
        if (self.task_ids is None) == (self.from_task_set is None):
            raise ValueError("give task_ids or from_task_set (with split eval), exactly one")
        return self


class EvalSetFrozen(BaseModel):
    """The frozen eval set version governance stored."""

    eval_set_id: str
    name: str
    version: int
    content_hash: str | None
    task_ids: list[str]
    decision_id: str
    workflow_id: str


async def freeze_eval_set(
    *, guard: Guard, db: Sessions, services: WebServices, body: EvalSetFreeze
) -> EvalSetFrozen:
    """Check the tasks, record the operator's decision and have governance freeze the set."""
    for action, kind in (("create", "eval_set"), ("create", "eval_item"),
                         ("freeze", "eval_set")):
        await guard(action, kind, attrs={"name": body.name})
    details: dict[str, Any] = {}
    if body.from_task_set is not None:
        found = await db.read(task_set_refs.split_for, ref=body.from_task_set, split=body.split,
                              allowed="eval", use="an eval set")
        if found.problem is not None:
            raise invalid("from_task_set cannot be frozen as an eval set", [
                f"from_task_set: {found.problem}"])
        if len(found.task_ids) > MAX_EVAL_TASKS:
            raise invalid("the eval split is too large for one eval set", [
                f"from_task_set: {len(found.task_ids)} tasks in split eval; at most"
                f" {MAX_EVAL_TASKS}"])
        task_ids = found.task_ids
        details = {"task_set_id": found.task_set_id, "split": body.split}
    else:
        task_ids = list(body.task_ids or [])
    repeated = sorted({t for t in task_ids if task_ids.count(t) > 1})
    if repeated:
        raise invalid("each task may be listed once", [f"{t}: listed more than once"
                                                       for t in repeated])
    await _admitted(db, task_ids)
    decision_id, workflow_id, result = await _decide(
        guard=guard, db=db, services=services, kind=DecisionKind.EVAL_SET, subject=body.name,
        decision=Decision.CREATE, comment=body.comment,
        details={"task_ids": task_ids, **details})
    return EvalSetFrozen(eval_set_id=result.id, name=result.name, version=result.version,
                         content_hash=result.details.get("content_hash"),
                         task_ids=list(result.details.get("task_ids") or []),
                         decision_id=decision_id, workflow_id=workflow_id)


class ThresholdSet(BaseModel):
    """The next version of a threshold, for a frozen eval set."""

    name: str = Field(pattern=VERSIONED_NAME,
                      description="the threshold's name (promotions use 'promotion')")
    eval_set: str | None = Field(
        default=None, pattern=ID,
        description="the default frozen eval set (id, or a name: newest), for candidates"
                    " trained on an environment eval_sets does not name")
    eval_sets: dict[Annotated[str, Field(pattern=ID)],
                    Annotated[list[Annotated[str, Field(pattern=ID)]],
                              Field(min_length=1, max_length=50)]] | None = Field(
        default=None, max_length=100,
        description="environment name (or environment version id) -> the frozen eval sets"
                    " a candidate trained on it is judged on; a candidate trained on several"
                    " environments must pass every one's sets")
    spec: dict[str, Any] = Field(description="a ThresholdSpec; its version is assigned")
    comment: str = Field(default="", max_length=2000, description="why (optional)")


class ThresholdStored(BaseModel):
    """The threshold version governance stored."""

    threshold_id: str
    name: str
    version: int
    eval_set_id: str | None
    eval_sets: dict[str, list[str]] | None = Field(
        default=None, description="environment -> the eval set ids judging its candidates")
    spec: dict[str, Any]
    decision_id: str
    workflow_id: str


async def set_threshold(
    *, guard: Guard, db: Sessions, services: WebServices, body: ThresholdSet
) -> ThresholdStored:
    """Record the operator's decision and have governance check and store the threshold."""
    await guard("create", "threshold", attrs={"name": body.name})
    if body.eval_set is None and not body.eval_sets:
        raise invalid("the threshold names no eval set",
                      ["give eval_set (the default), eval_sets per environment, or both"])
    decision_id, workflow_id, result = await _decide(
        guard=guard, db=db, services=services, kind=DecisionKind.THRESHOLD, subject=body.name,
        decision=Decision.SET, comment=body.comment,
        details={"spec": body.spec, "eval_set": body.eval_set, "eval_sets": body.eval_sets})
    return ThresholdStored(threshold_id=result.id, name=result.name, version=result.version,
                           eval_set_id=result.details.get("eval_set_id"),
                           eval_sets=result.details.get("eval_sets"),
                           spec=dict(result.details.get("spec") or {}),
                           decision_id=decision_id, workflow_id=workflow_id)
