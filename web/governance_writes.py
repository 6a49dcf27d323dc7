"""What people write to governance's versioned data: environment versions (eval sets next).

The same path as every other decision (``web.actions``): authorize the person, check the
content, record a ``human_decision`` (only the web role may), then run governance's
``GovernanceWriteWorkflow`` with the row's id. Governance proves the row, asks OPA for the
person again and writes; the web role writes nothing else. A contract with problems is
refused (422, every problem named) before any row is recorded.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from triloop.contract_upload import upload_problems
from triloop.models import DecisionKind
from triloop.workflow_api import GovernanceWriteInput, governance_write_workflow_id
from web.data import decisions
from web.deps import Guard, Sessions, WebServices
from web.problems import invalid

ENVIRONMENT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"


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
    decision_id = await db.write(
        decisions.record_decision, kind=DecisionKind.ENVIRONMENT_VERSION, subject=body.name,
        decision="register", user=guard.principal.name, comment=body.comment.strip(),
        details={"contract_yaml": body.contract_yaml, "fixtures": body.fixtures})
    workflow_id = governance_write_workflow_id(decision_id)
    result = await services.orchestrator.governance_write(
        GovernanceWriteInput(decision_id=decision_id, kind=DecisionKind.ENVIRONMENT_VERSION,
                             subject=body.name),
        workflow_id, user=guard.principal.name)
    return EnvironmentRegistered(version_id=result.id, environment=result.name,
                                 version=result.version, created=result.created,
                                 decision_id=decision_id, workflow_id=workflow_id)
