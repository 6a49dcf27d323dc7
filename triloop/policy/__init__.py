"""Policy layer: every privileged action asks the OPA server through ``Authorizer.authorize``.

The rules live in ``policies/triloop/authz`` (Rego); this package builds the input,
queries ``data.triloop.authz.decision``, fails closed, and hands every decision to the
audit sink. See ``opa.py`` for the wire details and why it uses httpx.
"""

from triloop.policy.authorize import Authorizer
from triloop.policy.model import (
    Actor,
    AuditSink,
    Decision,
    PolicyDenied,
    Resource,
    acting_for,
    describe_actor,
    policy_input,
)
from triloop.policy.opa import DECISION_PATH, OpaClient, decision_from_response

__all__ = [
    "DECISION_PATH",
    "Actor",
    "AuditSink",
    "Authorizer",
    "Decision",
    "OpaClient",
    "PolicyDenied",
    "Resource",
    "acting_for",
    "decision_from_response",
    "describe_actor",
    "policy_input",
]
