"""A person's writes to governance's versioned data, carried out on their recorded decision.

The web service authenticated the person, asked OPA, checked the content and recorded a
``human_decision``; the workflow hands over only its id. Each activity here proves the
decision (``load_decision``: recorded by the web role, this kind and subject, a person who
holds the operator role now), asks OPA again as governance acting for that person, then
writes as the server-side functions always did, in one transaction, audited with the
decision's id. Any refusal is raised before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from temporalio import activity

from governance_loop.activities.common import GovernanceShell, refused
from governance_loop.activities.messages import REGISTER_ENVIRONMENT_VERSION
from governance_loop.environments import (
    ContractDocument,
    document_from_file,
    store_environment_version,
    version_resource,
)
from triloop.contract_upload import decode_fixtures, laid_out
from triloop.contracts import ContractError
from triloop.environment_code import EnvironmentCodeError
from triloop.models import DecisionKind
from triloop.policy import Resource
from triloop.workflow_api import GovernanceWriteInput, GovernanceWriteResult

DECIDING_ROLE = "operator"


def contract_document(name: str, details: Mapping[str, Any]) -> ContractDocument:
    """The uploaded contract, checked and identified as a file on disk would be."""
    text = details.get("contract_yaml")
    fixtures = details.get("fixtures") or {}
    if not isinstance(text, str) or not isinstance(fixtures, dict):
        raise refused("the decision holds no contract text to register")
    files, problems = decode_fixtures(fixtures)
    if problems:
        raise refused("; ".join(str(p) for p in problems))
    try:
        with laid_out(text, files) as path:
            return document_from_file(path, name=name)
    except ContractError as error:
        raise refused("; ".join(str(p) for p in error.problems)) from error
    except (EnvironmentCodeError, OSError, ValueError) as error:
        raise refused(str(error)) from error


class GovernanceWriteActivities(GovernanceShell):
    """Registers environment versions for the person who decided so."""

    @activity.defn(name=REGISTER_ENVIRONMENT_VERSION)
    def register_environment_version(self, request: GovernanceWriteInput) -> GovernanceWriteResult:
        """Prove the decision, check the contract, ask OPA for the person, then register."""
        subject = Resource("environment", id=request.subject)
        proven = self.prove(request.decision_id, DecisionKind.ENVIRONMENT_VERSION,
                            request.subject, role=DECIDING_ROLE, resource=subject)
        document = contract_document(proven.subject, proven.details)
        self.authorize_for(proven, "create", version_resource(document))
        stored = store_environment_version(engine=self._engine, document=document,
                                           requested_by=proven.user, decision_id=proven.id)
        return GovernanceWriteResult(
            kind=DecisionKind.ENVIRONMENT_VERSION.value, id=stored.id,
            name=stored.environment_name, version=stored.version, created=stored.created)
