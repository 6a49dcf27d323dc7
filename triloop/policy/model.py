"""The plain data of a policy question and its answer: who, what, on what, and the decision."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Actor:
    """Who asks: a loop service, or the web service for a signed-in person."""

    service: str
    user: str | None = None
    roles: tuple[str, ...] = ()
    credential: str | None = field(default=None, repr=False, compare=False)
    """The raw secret the person presented with this request (web only): never sent to the
    policy nor stored; the database checks it when an audit row names the person."""

    def to_input(self) -> dict[str, Any]:
        """The ``actor`` object of the policy input."""
        doc: dict[str, Any] = {"service": self.service, "roles": list(self.roles)}
        if self.user is not None:
            doc["user"] = self.user
        return doc


@dataclass(frozen=True)
class Resource:
    """What is acted on; ``attrs`` carries the facts duties need (``submitted_by``, ...)."""

    kind: str
    id: str | None = None
    owner: str | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def to_input(self) -> dict[str, Any]:
        """The ``resource`` object of the policy input."""
        doc: dict[str, Any] = {"kind": self.kind, "attrs": dict(self.attrs)}
        if self.id is not None:
            doc["id"] = self.id
        if self.owner is not None:
            doc["owner"] = self.owner
        return doc


@dataclass(frozen=True)
class Decision:
    """OPA's answer: allow or not, why, and what identifies it in OPA's decision log."""

    allow: bool
    reasons: tuple[str, ...]
    decision_id: str | None
    policy_revision: str | None


class PolicyDenied(Exception):
    """The policy refused an action; ``decision`` says why."""

    def __init__(self, actor: Actor, action: str, resource: Resource, decision: Decision):
        self.actor = actor
        self.action = action
        self.resource = resource
        self.decision = decision
        target = resource.kind if resource.id is None else f"{resource.kind} {resource.id}"
        reasons = "; ".join(decision.reasons) or "no reason given"
        super().__init__(
            f"{describe_actor(actor)} may not {action} {target}: {reasons}"
            f" (decision {decision.decision_id or 'without id'})"
        )


AuditSink = Callable[[Actor, str, Resource, Decision, Mapping[str, Any] | None], None]
"""Records one decision: (actor, action, resource, decision, context)."""


def describe_actor(actor: Actor) -> str:
    """A short human description of an actor for messages."""
    if actor.user is None:
        return f"service {actor.service}"
    return f"{actor.user} ({', '.join(actor.roles) or 'no roles'}) via {actor.service}"


def acting_for(person: Actor, **extra: Any) -> dict[str, Any]:
    """The ``context`` a loop worker sends when it carries out this person's decision."""
    if person.user is None:
        raise ValueError("acting_for needs a person: the actor has no user")
    return {"on_behalf_of": {"user": person.user, "roles": list(person.roles)}, **extra}


def policy_input(
    actor: Actor, action: str, resource: Resource, context: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``input`` document for ``data.triloop.authz.decision``."""
    doc: dict[str, Any] = {
        "actor": actor.to_input(),
        "action": action,
        "resource": resource.to_input(),
    }
    if context is not None:
        doc["context"] = dict(context)
    return doc
