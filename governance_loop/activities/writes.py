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
    REGISTER_ENVIRONMENT_VERSION,
    SET_THRESHOLD,
)
from governance_loop.environments import (
    ContractDocument,
    ServiceRegistrationError,
    check_served,
    document_from_file,
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
from triloop.artifacts import ArtifactStore
from triloop.contract_upload import decode_fixtures, laid_out
from triloop.contracts import ContractError
from triloop.decisions import HumanDecision
from triloop.environment_code import EnvironmentCodeError
from triloop.models import DecisionKind
from triloop.policy import Authorizer, Resource
from triloop.workflow_api import ErrorType, GovernanceWriteInput, GovernanceWriteResult

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
    """Registers versions, freezes eval sets and sets thresholds for the person who decided."""

    def __init__(self, engine: Engine, authorizer: Authorizer, *,
                 fixtures: ArtifactStore | None = None) -> None:
        super().__init__(engine, authorizer)
        self._fixtures = fixtures  # where a version's uploaded fixtures are published

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
                                           fixtures=self._fixtures)
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
