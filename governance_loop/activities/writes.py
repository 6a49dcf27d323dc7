"""A person's writes to governance's versioned data, carried out on their recorded decision.

The web service authenticated the person, asked OPA, checked what it could and recorded a
``human_decision``; the workflow hands over only its id. Each activity here proves the
decision (``load_decision``: recorded by the web role, this kind and subject, a person who
holds the operator role now), asks OPA again as governance acting for that person, then
writes as the server-side functions always did, in one transaction, audited with the
decision's id. Any refusal is raised before anything is written; row ids are fixed per
activity execution, so a retry after a commit returns what the first attempt wrote.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine
from temporalio import activity
from temporalio.exceptions import ApplicationError

from governance_loop.activity_support import GovernanceShell, row_id
from governance_loop.contracts import (
    CREATE_EVAL_SET,
    PREPARE_TASK_SET,
    REGISTER_ENVIRONMENT_VERSION,
    SET_THRESHOLD,
    STORE_TASK_SET,
    TaskSetStoreInput,
)
from governance_loop.environments import (
    ContractDocument,
    ServiceRegistrationError,
    check_served,
    document_from_file,
    resolve_version,
    store_environment_version,
    version_resource,
)
from governance_loop.evalsets import (
    EvalSetError,
    eval_set_resources,
    resolve_threshold_eval_sets,
    store_eval_set,
    store_threshold,
)
from governance_loop.gates import ThresholdSpec, ThresholdSpecError
from governance_loop.store import StoreError
from governance_loop.task_sets import TaskSetError, store_task_set
from triloop.artifacts import ArtifactNotFound, ArtifactStore
from triloop.contract_upload import decode_fixtures, laid_out
from triloop.contracts import ContractError
from triloop.db import session_scope
from triloop.decisions import HumanDecision
from triloop.environment_code import EnvironmentCodeError
from triloop.models import DecisionKind
from triloop.policy import Authorizer, Resource
from triloop.task_sources import TaskSourceError, dataset_rows, split_field, take_split_field
from triloop.workflow_api import (
    DescribeTasksInput,
    ErrorType,
    GovernanceWriteInput,
    GovernanceWriteResult,
    TaskToDescribe,
)

DECIDING_ROLE = "operator"


def invalid_request(summary: str, reasons: Sequence[str]) -> ApplicationError:
    """What was asked cannot be stored: never retried; the web answers 422 with ``reasons``."""
    return ApplicationError(f"{summary}: {'; '.join(reasons)}", list(reasons),
                            type=ErrorType.INVALID_REQUEST, non_retryable=True)


def contract_document(name: str, details: Mapping[str, Any]) -> ContractDocument:
    """The uploaded contract, checked and identified as a file on disk would be."""
    text = details.get("contract_yaml")
    fixtures = details.get("fixtures") or {}
    if not isinstance(text, str) or not isinstance(fixtures, dict):
        raise invalid_request("the decision holds no contract", ["contract_yaml is missing"])
    files, problems = decode_fixtures(fixtures)
    if problems:
        raise invalid_request("the fixtures are invalid", [str(p) for p in problems])
    try:
        with laid_out(text, files) as path:
            return document_from_file(path, name=name)
    except ContractError as error:
        raise invalid_request(f"the contract has {len(error.problems)} problem(s)",
                              [str(p) for p in error.problems]) from error
    except (EnvironmentCodeError, OSError, ValueError) as error:
        raise invalid_request("the contract cannot be registered", [str(error)]) from error


def _strings(value: object, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid_request(f"the decision's {what} is not a list of ids", [what])
    return list(value)


class GovernanceWriteActivities(GovernanceShell):
    """Registers versions and task sets, freezes eval sets and sets thresholds for the person
    who decided."""

    def __init__(self, engine: Engine, authorizer: Authorizer,
                 *, store: ArtifactStore | None = None) -> None:
        super().__init__(engine, authorizer)
        # Where a version's uploaded fixtures are published and a task set's dataset lies.
        self._store = store

    def _proven(self, request: GovernanceWriteInput, kind: DecisionKind) -> HumanDecision:
        return self.prove(request.decision_id, kind, request.subject, role=DECIDING_ROLE,
                          resource=Resource(kind.value, attrs={"name": request.subject}))

    @activity.defn(name=REGISTER_ENVIRONMENT_VERSION.name)
    def register_environment_version(self, request: GovernanceWriteInput) -> GovernanceWriteResult:
        """Prove the decision, check the contract, ask OPA for the person, then register."""
        proven = self._proven(request, DecisionKind.ENVIRONMENT_VERSION)
        document = contract_document(proven.subject, proven.details)
        self.authorize_for(proven, "create", version_resource(document))
        try:
            check_served(document)
        except ServiceRegistrationError as error:
            raise invalid_request("the environment service does not match its contract",
                                  error.problems) from error
        stored = store_environment_version(engine=self._engine, document=document,
                                           requested_by=proven.user, decision_id=proven.id,
                                           fixtures=self._store)
        return GovernanceWriteResult(
            kind=DecisionKind.ENVIRONMENT_VERSION.value, id=stored.id,
            name=stored.environment_name, version=stored.version, created=stored.created)

    @activity.defn(name=CREATE_EVAL_SET.name)
    def create_eval_set(self, request: GovernanceWriteInput) -> GovernanceWriteResult:
        """Prove the decision, ask OPA for the person, then create and freeze the version."""
        proven = self._proven(request, DecisionKind.EVAL_SET)
        task_ids = _strings(proven.details.get("task_ids"), "task_ids")
        for action, resource in eval_set_resources(proven.subject):
            self.authorize_for(proven, action, resource)
        try:
            stored = store_eval_set(engine=self._engine, name=proven.subject, task_ids=task_ids,
                                    requested_by=proven.user, row_id=row_id("eval_set"),
                                    decision_id=proven.id)
        except EvalSetError as error:
            raise invalid_request("the eval set cannot be frozen", [str(error)]) from error
        return GovernanceWriteResult(
            kind=DecisionKind.EVAL_SET.value, id=stored.id, name=stored.name,
            version=stored.version,
            details={"content_hash": stored.content_hash, "task_ids": stored.task_ids})

    @activity.defn(name=SET_THRESHOLD.name)
    def set_threshold(self, request: GovernanceWriteInput) -> GovernanceWriteResult:
        """Prove the decision, check the spec, ask OPA for the person, then store the version."""
        proven = self._proven(request, DecisionKind.THRESHOLD)
        spec, eval_set = proven.details.get("spec"), proven.details.get("eval_set")
        eval_sets = proven.details.get("eval_sets")
        if (not isinstance(spec, dict) or not isinstance(eval_set, str | None)
                or not isinstance(eval_sets, dict | None)):
            raise invalid_request("the decision holds no threshold", ["spec or eval_set"])
        try:
            ThresholdSpec.from_mapping({**spec, "version": f"{proven.subject}@v0"})
            eval_set_id, per_environment = resolve_threshold_eval_sets(
                engine=self._engine, eval_set=eval_set, eval_sets=eval_sets)
        except (ThresholdSpecError, EvalSetError) as error:
            raise invalid_request("the threshold cannot be set", [str(error)]) from error
        self.authorize_for(proven, "create", Resource(
            "threshold", attrs={"name": proven.subject, "eval_set_id": eval_set_id}))
        stored = store_threshold(engine=self._engine, name=proven.subject, spec=spec,
                                 eval_set_id=eval_set_id, requested_by=proven.user,
                                 row_id=row_id("threshold"), decision_id=proven.id,
                                 eval_sets=per_environment)
        return GovernanceWriteResult(
            kind=DecisionKind.THRESHOLD.value, id=stored.id, name=stored.name,
            version=stored.version,
            details={"eval_set_id": stored.eval_set_id, "spec": stored.spec,
                     "eval_sets": stored.eval_sets})

    def _task_set(self, request: GovernanceWriteInput, *, use: bool = True
                  ) -> tuple[HumanDecision, dict[str, Any]]:
        proven = self.prove(request.decision_id, DecisionKind.TASK_SET, request.subject,
                            role=DECIDING_ROLE, use=use,
                            resource=Resource("task_set", attrs={"name": request.subject}))
        details = dict(proven.details)
        if not isinstance(details.get("source"), dict) or not isinstance(
                details.get("split_rule"), dict) or not isinstance(
                details.get("environment_version"), str):
            raise invalid_request("the decision holds no task set",
                                  ["source, split_rule or environment_version"])
        return proven, details

    @activity.defn(name=PREPARE_TASK_SET.name)
    def prepare_task_set(self, request: GovernanceWriteInput) -> DescribeTasksInput:
        """Prove the decision, ask OPA for the person, resolve the version: what to describe."""
        proven, details = self._task_set(request, use=False)  # the store step uses it
        try:
            with session_scope(self._engine) as session:
                version = resolve_version(session, details["environment_version"])
                version_id, retired = version.id, version.retired_at is not None
        except StoreError as error:
            raise invalid_request("the task set cannot be registered", [str(error)]) from error
        if retired:
            raise invalid_request("the task set cannot be registered", [
                f"environment version {details['environment_version']} is retired"])
        self.authorize_for(proven, "create", Resource("task_set", attrs={
            "name": proven.subject, "environment_version_id": version_id}))
        source, kind = details["source"], details.get("source_kind")
        described = DescribeTasksInput(request_id=request.decision_id,
                                       environment_version_id=version_id)
        if kind == "seeds":
            described.tasks = [TaskToDescribe(seed=int(s)) for s in source.get("seeds", [])]
        elif kind == "generator":
            described.generator = dict(source.get("params") or {})
        elif kind == "dataset":
            described.dataset_sha256 = str(source.get("sha256"))
            described.dataset_format = str(source.get("format"))
            described.split_field = split_field(details["split_rule"])
        else:
            raise invalid_request("the task set cannot be registered",
                                  [f"unknown source kind {kind!r}"])
        return described

    @activity.defn(name=STORE_TASK_SET.name)
    def store_task_set(self, request: TaskSetStoreInput) -> GovernanceWriteResult:
        """Prove the decision again, then split, check and write the set in one transaction."""
        proven, details = self._task_set(request.request)
        described = request.described
        if described.problems:
            raise invalid_request(f"{len(described.problems)} task(s) cannot be described",
                                  described.problems)
        self.authorize_for(proven, "create", Resource("task_set", attrs={
            "name": proven.subject,
            "environment_version_id": described.environment_version_id}))
        kind = str(details.get("source_kind"))
        items = self._items(details, len(described.tasks)) if kind == "dataset" else [
            t.item for t in described.tasks]
        try:
            stored = store_task_set(
                engine=self._engine, name=proven.subject,
                environment_version_id=described.environment_version_id, source_kind=kind,
                source=details["source"], split_rule=details["split_rule"],
                tags={str(k): str(v) for k, v in (details.get("tags") or {}).items()},
                described=described.tasks, items=items, requested_by=proven.user,
                decision_id=proven.id)
        except TaskSetError as error:
            raise invalid_request("the task set cannot be registered", error.problems) from error
        return GovernanceWriteResult(
            kind=DecisionKind.TASK_SET.value, id=stored.id, name=stored.name,
            version=stored.version, created=stored.created,
            details={"splits": stored.splits, "new_tasks": stored.new_tasks,
                     "environment_version_id": described.environment_version_id})

    def _items(self, details: Mapping[str, Any], count: int) -> list[dict[str, Any] | None]:
        """A dataset's items, read back from the artifact store as execution read them."""
        source = details["source"]
        if self._store is None:
            raise invalid_request("the task set cannot be registered",
                                  ["no artifact store is configured to read the dataset from"])
        try:
            rows = dataset_rows(self._store.get_bytes(str(source.get("sha256"))),
                                str(source.get("format")))
            items, _ = take_split_field(rows, split_field(details["split_rule"]))
        except (TaskSourceError, ArtifactNotFound) as error:
            raise invalid_request("the dataset cannot be read", [str(error)]) from error
        if len(items) != count:
            raise invalid_request("the dataset changed", [
                f"{len(items)} rows now, {count} described"])
        return list(items)
