"""Rollback: production returns to the last revision that was not rolled back, in one transaction.

The same activity serves an operator's rollback (through ``RollbackWorkflow``,
authorized for the person) and a promotion's automatic rollback (the watch
found a regression; authorized as the governance service). The target comes from
the alias's history (``triloop.deployment_history``): never the checkpoint serving
now, never one rolled back since it was last promoted, so rolling back twice does not
re-serve the candidate the first rollback removed; that candidate needs a new
promotion. An operator may name an earlier revision; naming a rolled-back one is
refused (and audited). Alias, history and routing change together, so the next
episode the execution loop routes already uses the target.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine
from sqlmodel import Session, col, select
from temporalio import activity

from governance_loop import store
from governance_loop.activity_support import GOVERNANCE, GovernanceShell, record, refused
from governance_loop.contracts import ROLLBACK_DEPLOYMENT
from triloop.db import session_scope
from triloop.deployment_history import RollbackRefused, plan_rollback
from triloop.models import AuditEvent, Checkpoint, DecisionKind
from triloop.policy import Authorizer, Resource
from triloop.retention import CheckpointPruned, refuse_pruned
from triloop.statuses import PromotionStatus, Purpose
from triloop.workflow_api import RollbackInput, RollbackResult


def _request_key() -> str:
    """Identifies this request across activity retries (kept in the rollback's audit event,
    never in the reason people read)."""
    try:
        info = activity.info()
    except RuntimeError:
        return ""
    return f"[{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}]"


class RollbackActivities(GovernanceShell):
    """Moves an alias back to its rollback target."""

    @activity.defn(name=ROLLBACK_DEPLOYMENT.name)
    def rollback_deployment(self, request: RollbackInput) -> RollbackResult:
        """Authorize, then move the alias back through its history and reroute production."""
        to_revision: int | None = None
        to_checkpoint_id: str | None = None
        if request.promotion_id is not None:  # the watch's automatic rollback
            self.authorize("rollback", Resource("deployment", id=request.alias), context={
                "automatic": True, "promotion_id": request.promotion_id,
                "reason": request.reason})
            self.own(request.promotion_id, "rollback")
            actor, reason = "governance", request.reason
        else:  # an operator's: who, why and where to come from the decision the web recorded
            resource = Resource("deployment", id=request.alias)
            proven = self.prove(request.decision_id, DecisionKind.ROLLBACK, request.alias,
                                role="operator", resource=resource)
            to_revision = _optional_int(proven.details.get("to_revision"))
            to_checkpoint_id = proven.details.get("to_checkpoint_id") or None
            self.authorize_for(proven, "rollback", Resource("deployment", id=request.alias, attrs={
                "requested_by": proven.user, "to_revision": to_revision,
                "to_checkpoint_id": to_checkpoint_id}))
            actor, reason = proven.user, proven.comment
        key = _request_key()
        with session_scope(self._engine) as session:
            done = self._already_done(session, request.alias, key)
            if done is not None:
                return done
            current = store.get_deployment(session=session, alias=request.alias, for_update=True)
            if current is None:
                raise refused(f"alias {request.alias!r} is not deployed; nothing to roll back")
            previous, promotion_id = current.checkpoint_id, current.promotion_id
            problem: str | None = None
            try:
                plan = plan_rollback(
                    store.deployment_revisions(session=session, alias=request.alias),
                    alias=request.alias, current_checkpoint_id=previous,
                    to_revision=to_revision, to_checkpoint_id=to_checkpoint_id,
                )
            except RollbackRefused as refusal:
                problem = str(refusal)
            if problem is None:
                problem = _pruned_problem(session, plan.target.checkpoint_id)
            if problem is None:
                target = plan.target.checkpoint_id
                store.move_alias(
                    session=session, alias=request.alias, checkpoint_id=target,
                    rollback_target_id=None, promotion_id=None, actor=actor, kind="rollback",
                    reason=history_reason(reason),
                )
                store.refresh_rollback_target(session=session, alias=request.alias)
                self._reroute(session, request.alias, target, actor)
                if promotion_id is not None:
                    promotion = store.get_promotion(session=session, promotion_id=promotion_id)
                    if promotion.status == PromotionStatus.promoted:
                        store.update_promotion(session=session, promotion_id=promotion_id,
                                               status=PromotionStatus.rolled_back, reason=reason)
                record(session, action="rollback",
                       resource={"kind": "deployment", "id": request.alias},
                       payload={"from": previous, "to": target, "requested_by": actor,
                                "reason": reason, "promotion_id": promotion_id,
                                "target_revision": plan.target.number,
                                "requested_revision": to_revision,
                                "requested_checkpoint_id": to_checkpoint_id,
                                "human_decision_id": request.decision_id or None,
                                "request_key": key or None})
        if problem is not None:
            with session_scope(self._engine) as session:  # the refusal is on record too
                record(session, action="refuse_rollback",
                       resource={"kind": "deployment", "id": request.alias},
                       payload={"requested_by": actor, "reason": reason,
                                "to_revision": to_revision, "to_checkpoint_id": to_checkpoint_id,
                                "human_decision_id": request.decision_id or None,
                                "serving": previous, "refusal": problem})
            raise refused(problem)
        return RollbackResult(alias=request.alias, checkpoint_id=target,
                              previous_checkpoint_id=previous,
                              target_revision=plan.target.number)

    @staticmethod
    def _reroute(session: Session, alias: str, target: str, actor: str) -> None:
        if alias != Purpose.PRODUCTION:
            return
        store.set_routing(session=session, slot="production", checkpoint_id=target,
                          share=1.0, promotion_id=None, updated_by=actor)
        for slot in ("canary", "shadow"):
            store.set_routing(session=session, slot=slot, checkpoint_id=None, share=0.0,
                              promotion_id=None, updated_by=actor)

    @staticmethod
    def _already_done(session: Session, alias: str, key: str) -> RollbackResult | None:
        """The result of this very request if a retried attempt already committed it: its
        ``rollback`` audit event, written in the same transaction as the move, names it."""
        return committed_rollback(session, alias, key)


def committed_rollback(session: Session, alias: str, key: str) -> RollbackResult | None:
    """The rollback of ``alias`` that the request ``key`` already committed, if any."""
    if not key:
        return None
    row = session.exec(select(AuditEvent).where(
        AuditEvent.action == "rollback",
        col(AuditEvent.resource)["id"].astext == alias,
        col(AuditEvent.payload)["request_key"].astext == key,
    )).first()
    if row is None:
        return None
    return RollbackResult(alias=alias, checkpoint_id=str(row.payload["to"]),
                          previous_checkpoint_id=str(row.payload.get("from") or ""),
                          target_revision=int(row.payload.get("target_revision") or 0))


def history_reason(reason: str) -> str:
    """The reason a rollback's history row keeps: the person's or the watch's own words."""
    return reason.strip() or "rollback"


def _pruned_problem(session: Session, checkpoint_id: str) -> str | None:
    """Why the rollback target cannot serve: its weights were pruned (None: they are kept).

    Retention keeps every checkpoint of a deployment history, so this names a fault
    (a store emptied by hand, a rule changed), in the rule's words, instead of a crash
    when execution goes to load it.
    """
    row = session.get(Checkpoint, checkpoint_id)
    if row is None:
        return f"rollback target {checkpoint_id} has no checkpoint row"
    try:
        refuse_pruned(row, wanted_for="rolled back to")
    except CheckpointPruned as pruned:
        return str(pruned)
    return None


def _optional_int(value: object) -> int | None:
    """A revision number a person named, as stored in their decision's details."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise refused(f"the rollback decision names revision {value!r}, not a number")
    try:
        return int(value)
    except ValueError as exc:
        raise refused(f"the rollback decision names revision {value!r}, not a number") from exc


def bootstrap_production(
    *, engine: Engine, authorizer: Authorizer, checkpoint_id: str, requested_by: str,
    roles: Sequence[str] = (), replace: bool = False,
) -> RollbackResult:
    """Deploy a base checkpoint as production when nothing is deployed yet (or ``replace``).

    Later moves go through promotions; ``replace`` is for development stacks. The
    rollback target is then the last earlier revision that was not rolled back.
    """
    with session_scope(engine) as session:
        row = session.get(Checkpoint, checkpoint_id)
        if row is None:
            raise store.StoreError(f"checkpoint {checkpoint_id} does not exist")
        try:
            refuse_pruned(row, wanted_for="deployed as production")
        except CheckpointPruned as pruned:
            raise store.StoreError(str(pruned)) from pruned
        current = store.get_deployment(session=session, alias="production")
    if current is not None and not replace:
        raise store.StoreError(
            f"production already serves {current.checkpoint_id}; promote a candidate instead "
            "(or pass replace on a development stack)"
        )
    authorizer.authorize(
        GOVERNANCE, "create" if current is None else "update",
        Resource("deployment", id="production", attrs={"checkpoint_id": checkpoint_id}),
        context={"requested_by": {"user": requested_by, "roles": list(roles)},
                 "bootstrap": True},
    )
    with session_scope(engine) as session:
        current = store.get_deployment(session=session, alias="production", for_update=True)
        previous = current.checkpoint_id if current is not None else None
        store.move_alias(session=session, alias="production", checkpoint_id=checkpoint_id,
                         rollback_target_id=None, promotion_id=None, actor=requested_by,
                         reason="bootstrap production", kind="bootstrap")
        store.refresh_rollback_target(session=session, alias="production")
        store.set_routing(session=session, slot="production", checkpoint_id=checkpoint_id,
                          share=1.0, promotion_id=None, updated_by=requested_by)
        for slot in ("canary", "shadow"):
            store.set_routing(session=session, slot=slot, checkpoint_id=None, share=0.0,
                              promotion_id=None, updated_by=requested_by)
        record(session, action="bootstrap_production",
               resource={"kind": "deployment", "id": "production"},
               payload={"checkpoint_id": checkpoint_id, "previous": previous,
                        "requested_by": requested_by})
    return RollbackResult(alias="production", checkpoint_id=checkpoint_id,
                          previous_checkpoint_id=previous or "")
