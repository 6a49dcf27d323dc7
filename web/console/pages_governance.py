"""Console pages: promotions and decisions, rollback with confirmation, deployments, bases.

(The audit log and lineage are in ``pages_audit``.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import ValidationError

from triloop.statuses import GATE_ORDER, PromotionDecision, PromotionStatus, Purpose
from triloop.workflow_api import GateSummary
from web import actions
from web.actions import DecisionRequest, RollbackRequest
from web.console.decisions import offer_for
from web.console.gate_analysis import analyse_gate, open_gate_notice
from web.console.pages_transcripts import promotion_transcripts
from web.console.rendering import ConsoleGuard, CsrfChecked, page, redirect
from web.data import deployments, evaluation, lineage, promotions
from web.data.promotions import GateView
from web.deps import Guard, ServicesDep, SessionDep, Sessions
from web.pagination import CursorParam
from web.problems import ProblemError, invalid, not_found
from web.request_fields import field_with_nul

router = APIRouter(include_in_schema=False)
# What the notice says once governance recorded the decision.
DONE = {PromotionDecision.SIGN_AUDIT: "Audit signed",
        PromotionDecision.REJECT_AUDIT: "Audit refused",
        PromotionDecision.APPROVE: "Approved", PromotionDecision.REJECT: "Rejected",
        PromotionDecision.OVERRIDE_ALARMS: "Stability alarms overridden"}


@router.get("/promotions", response_class=HTMLResponse)
async def promotions_page(
    request: Request, guard: ConsoleGuard, db: SessionDep, cursor: CursorParam = None
) -> Response:
    """All promotions, newest first."""
    await guard("read", "promotion")
    listing = await db.read(promotions.list_promotions, limit=25, cursor=cursor)
    return page(request, "promotions.html", guard.principal, title="Promotions", listing=listing)


@router.get("/eval-sets", response_class=HTMLResponse)
async def eval_sets_page(
    request: Request, guard: ConsoleGuard, db: SessionDep, cursor: CursorParam = None
) -> Response:
    """Frozen eval sets, newest first."""
    await guard("read", "eval_set")
    listing = await db.read(evaluation.list_eval_sets, limit=25, cursor=cursor)
    return page(request, "eval_sets.html", guard.principal, title="Eval sets", listing=listing)


@router.get("/eval-sets/{eval_set_id}", response_class=HTMLResponse)
async def eval_set_page(
    request: Request, eval_set_id: str, guard: ConsoleGuard, db: SessionDep
) -> Response:
    """An eval set: its coverage per tag, its thresholds, and its items for roles that may
    see them."""
    await guard("read", "eval_set", id=eval_set_id)
    with_items = await guard.allows("read", "eval_item", id=eval_set_id)
    detail = await db.read(evaluation.eval_set_detail, eval_set_id=eval_set_id,
                           with_items=with_items)
    if detail is None:
        raise not_found("eval set", eval_set_id)
    return page(request, "eval_set.html", guard.principal,
                title=f"Eval set {detail.name} v{detail.version}", eval_set=detail)


@router.get("/promotions/{promotion_id}", response_class=HTMLResponse)
async def promotion_page(
    request: Request, promotion_id: str, guard: ConsoleGuard, db: SessionDep
) -> Response:
    """Gate timeline with evidence vs thresholds, approvals, and this person's decisions."""
    return await promotion_view(request, guard, db, promotion_id)


@dataclass(frozen=True)
class FormProblem:
    """A decision form sent back: what the person wrote and what is wrong with it."""

    comment: str
    message: str


async def promotion_view(
    request: Request, guard: Guard, db: Sessions, promotion_id: str, *,
    form: FormProblem | None = None,
) -> Response:
    """The promotion page; with ``form``, its decision form comes back (422) holding the
    person's input and the error beside the field."""
    await guard("read", "promotion", id=promotion_id)
    with_approvals = await guard.allows("read", "approval", id=promotion_id)
    with_alarms = await guard.allows("read", "training_step")
    detail = await db.read(promotions.promotion_detail, promotion_id=promotion_id,
                           with_approvals=with_approvals, with_alarms=with_alarms)
    facts = await db.read(promotions.decision_facts, promotion_id=promotion_id,
                          user=guard.principal.name)
    if detail is None or facts is None:
        raise not_found("promotion", promotion_id)
    offer = await offer_for(guard, facts)
    production = await db.read(deployments.get_deployment, alias=Purpose.PRODUCTION)
    # The button names where a rollback would go, and is offered only when the rules
    # (triloop.deployment_history) find a target: never a rolled-back candidate.
    preview = (await db.read(deployments.rollback_preview, alias=Purpose.PRODUCTION)
               if production is not None else None)
    can_rollback = (
        preview is not None and preview.target is not None
        and await guard.would_allow("rollback", "deployment", id=Purpose.PRODUCTION)
    )
    by_gate = {g.gate: g for g in detail.gates}
    timeline: list[tuple[str, GateView | None]] = [(gate, by_gate.get(gate))
                                                   for gate in GATE_ORDER]
    timeline += [(g.gate, g) for g in detail.gates if g.gate not in GATE_ORDER]
    analyses = {g.id: analyse_gate(gate=g.gate, passed=g.passed, reasons=g.reasons,
                                   evidence=g.evidence, threshold_spec=g.threshold_spec)
                for g in detail.gates}
    spec = next((g.threshold_spec for g in detail.gates if g.threshold_spec), None)
    # One notice from one count: it cannot say "enough" and "waiting" side by side.
    open_notice = (open_gate_notice(detail.current_gate, spec, detail.traffic)
                   if detail.status == PromotionStatus.open and detail.current_gate else None)
    return page(request, "promotion.html", guard.principal, title=f"Promotion {promotion_id}",
                status_code=422 if form is not None else 200,
                promotion=detail, timeline=timeline, decisions=offer.decisions, offer=offer,
                form=form, can_rollback=can_rollback, production=production, preview=preview,
                analyses=analyses, open_notice=open_notice,
                transcripts=await promotion_transcripts(guard, db, promotion_id))


@router.post("/promotions/{promotion_id}/{form_action}")
async def decide(
    request: Request, promotion_id: str,
    form_action: Literal["sign-audit", "reject-audit", "approve", "reject", "override-alarms"],
    principal: CsrfChecked, services: ServicesDep, db: SessionDep,
    comment: Annotated[str, Form(max_length=4000)] = "",
) -> Response:
    """Send a decision to governance; the policy is asked again here, whatever the page showed.

    The form's path names the decision as the API's does (``sign-audit``: its words with
    dashes), so the console sends the same ``PromotionDecision`` the API does. A blank
    comment brings the form back with the person's input and the error beside the field.
    """
    decision = PromotionDecision(form_action.replace("-", "_"))
    guard = Guard(services, principal, refused_input=await field_with_nul(request))
    try:
        body = DecisionRequest(comment=comment)
    except ValidationError:
        if guard.refused_input is not None:  # a NUL: refused (and audited) as every field's
            await guard.screen(decision, "promotion", id=promotion_id)
        return await promotion_view(request, guard, db, promotion_id, form=FormProblem(
            comment=comment, message="Write why: a comment of only spaces says nothing,"
            " and every decision needs one."))
    outcome = await actions.decide_promotion(
        guard=guard, db=db, services=services, promotion_id=promotion_id, decision=decision,
        body=body)
    result = f" Governance answered: {describe_result(outcome.result)}"
    return redirect(request, f"/promotions/{promotion_id}",
                    notice=("success", f"{DONE[decision]} as {principal.name}.{result}"))


def describe_result(result: GateSummary) -> str:
    """A gate summary in words."""
    reasons = "; ".join(result.reasons)
    return f"{result.gate} gate {result.verdict}" + (f" ({reasons})" if reasons else "")


@router.get("/rollback", response_class=HTMLResponse)
async def rollback_confirm(
    request: Request, guard: ConsoleGuard, db: SessionDep, alias: str = "production",
    to_revision: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
) -> Response:
    """The confirmation step: what serves now, the revision it would go back to, the history."""
    return await rollback_view(request, guard, db, alias, to_revision)


async def rollback_view(
    request: Request, guard: Guard, db: Sessions, alias: str, to_revision: int | None, *,
    form: FormProblem | None = None,
) -> Response:
    """The rollback confirmation; with ``form``, it comes back (422) holding the reason the
    person wrote and the error beside the field."""
    await guard.screen("rollback", "deployment", id=alias)
    deployment = await db.read(deployments.get_deployment, alias=alias)
    if deployment is None:
        raise not_found("deployment alias", alias)
    if not await guard.would_allow("rollback", "deployment", id=alias):
        raise ProblemError(403, "Forbidden", "only operators may roll back a deployment")
    await guard("read", "deployment", id=alias)
    preview = await actions.preview_rollback(db=db, alias=alias, to_revision=to_revision)
    return page(request, "rollback.html", guard.principal, title=f"Roll back {alias}",
                status_code=422 if form is not None else 200, preview=preview, form=form)


@router.post("/rollback")
async def rollback(
    request: Request, principal: CsrfChecked, services: ServicesDep, db: SessionDep,
    alias: Annotated[str, Form(max_length=64)] = "production",
    reason: Annotated[str, Form(max_length=4000)] = "",
    confirm: Annotated[str, Form(max_length=10)] = "",
    to_revision: Annotated[int | None, Form(ge=1, le=2**31 - 1)] = None,
) -> Response:
    """Run the rollback to the revision the person confirmed; a blank reason or an unticked
    confirmation brings the form back with what they wrote."""
    guard = Guard(services, principal, refused_input=await field_with_nul(request))
    try:
        body = RollbackRequest(alias=alias, reason=reason, to_revision=to_revision)
    except ValidationError as exc:
        if not any(e.get("loc") == ("reason",) for e in exc.errors()):
            raise invalid("a rollback needs an alias and a reason") from exc
        return await rollback_view(request, guard, db, alias, to_revision, form=FormProblem(
            comment=reason, message="Write why: a reason of only spaces says nothing, and"
            " every rollback needs one."))
    if confirm != "yes":
        return await rollback_view(request, guard, db, alias, to_revision, form=FormProblem(
            comment=reason, message="Tick the confirmation box to roll back."))
    outcome = await actions.rollback(guard=guard, db=db, services=services, body=body)
    return redirect(request, "/deployments", notice=(
        "success", f"Rolled back {outcome.alias}: now {outcome.checkpoint_id} "
                   f"(was {outcome.previous_checkpoint_id})."))


@router.get("/deployments", response_class=HTMLResponse)
async def deployments_page(request: Request, guard: ConsoleGuard, db: SessionDep) -> Response:
    """Aliases with their history and routing; rollback for operators where a target exists."""
    await guard("read", "deployment")
    listing = await db.read(deployments.list_deployments, limit=50, cursor=None)
    routing = await db.read(deployments.list_routing, limit=50, cursor=None)
    can_rollback = await guard.would_allow("rollback", "deployment")
    previews = {d.alias: await db.read(deployments.rollback_preview, alias=d.alias)
                for d in listing.items}
    return page(request, "deployments.html", guard.principal, title="Deployments",
                listing=listing, routing=routing.items, can_rollback=can_rollback,
                previews=previews)


@router.get("/checkpoints", response_class=HTMLResponse)
async def bases_page(
    request: Request, guard: ConsoleGuard, db: SessionDep, cursor: CursorParam = None
) -> Response:
    """Base models: imported ones (name, source, parameters, dtypes, digests) and run bases."""
    await guard("read", "checkpoint")
    listing = await db.read(lineage.list_checkpoints, limit=25, cursor=cursor, bases=True)
    return page(request, "checkpoints.html", guard.principal, title="Base models",
                page_=listing)
