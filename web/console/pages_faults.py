"""Console pages: the serving faults in force, and inject/clear forms for operators.

The same actions as ``/api/faults`` (``web.faults``): authorized by the policy, audited.
A form the person got wrong comes back with their input and each error beside its field
(422), never a bare error page. Every console page shows a banner while a fault is in
force (``rendering.console_guard``); this page is where it links.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import ValidationError

from triloop.statuses import Purpose
from web import faults
from web.console.rendering import ConsoleGuard, CsrfChecked, page, redirect
from web.data import deployments
from web.deps import Guard, ServicesDep, SessionDep, Sessions, WebServices
from web.faults import KIND, FaultRequest
from web.problems import ProblemError
from web.request_fields import field_with_nul

router = APIRouter(include_in_schema=False)
FIELDS = ("checkpoint_id", "temperature", "note")


@router.get("/faults", response_class=HTMLResponse)
async def faults_page(
    request: Request, guard: ConsoleGuard, db: SessionDep, services: ServicesDep,
    checkpoint_id: str = "",
) -> Response:
    """Serving faults in force (who injected each, since when, the note); forms for operators."""
    return await faults_view(request, guard, db, services, entered={
        "checkpoint_id": checkpoint_id})


async def faults_view(
    request: Request, guard: Guard, db: Sessions, services: WebServices, *,
    entered: dict[str, str] | None = None, errors: dict[str, str] | None = None,
) -> Response:
    """The faults page; with ``errors``, the inject form comes back (422) with the input."""
    listed = await faults.list_faults(guard=guard, services=services, db=db)
    can_inject = await guard.would_allow("inject_fault", KIND)
    production = (await db.read(deployments.get_deployment, alias=Purpose.PRODUCTION)
                  if can_inject else None)
    values = {"temperature": "4.0", "note": "", **(entered or {})}
    if not values.get("checkpoint_id") and production is not None:
        values["checkpoint_id"] = production.checkpoint_id
    return page(request, "faults.html", guard.principal, title="Serving faults",
                status_code=422 if errors else 200, listed=listed, can_inject=can_inject,
                can_clear=bool(listed) and await guard.would_allow("clear_fault", KIND),
                production=production, values=values, errors=errors or {})


def field_errors(error: ValidationError) -> dict[str, str]:
    """Each invalid field's message, in words a person can act on."""
    found: dict[str, str] = {}
    for problem in error.errors():
        name = str(problem["loc"][0]) if problem.get("loc") else "form"
        found.setdefault(name, _worded(name, problem))
    return found


def _worded(name: str, problem: Any) -> str:
    kind = problem.get("type", "")
    if name == "note":
        return "Write a note saying why: it is recorded on every episode the fault touches."
    if name == "checkpoint_id":
        return ("Give a checkpoint id: letters, digits and . _ : - only."
                if kind != "missing" else "Give the id of the checkpoint to degrade.")
    if name == "temperature":
        return "The temperature must be a number above 0 and at most 1000."
    return str(problem.get("msg", "invalid"))


@router.post("/faults")
async def inject(
    request: Request, principal: CsrfChecked, services: ServicesDep, db: SessionDep,
    checkpoint_id: Annotated[str, Form(max_length=200)] = "",
    temperature: Annotated[str, Form(max_length=40)] = "",
    note: Annotated[str, Form(max_length=500)] = "",
) -> Response:
    """Inject a serving fault for an operator (the policy decides; audited)."""
    guard = Guard(services, principal, refused_input=await field_with_nul(request))
    request.state.guard = guard  # the outcome of the allowed act is audited next to it
    entered = {"checkpoint_id": checkpoint_id, "temperature": temperature, "note": note}
    try:
        body = FaultRequest(checkpoint_id=checkpoint_id.strip(), temperature=temperature,
                            note=note)
    except ValidationError as exc:
        await guard.screen("inject_fault", KIND, id=checkpoint_id or None)
        return await faults_view(request, guard, db, services, entered=entered,
                                 errors=field_errors(exc))
    try:
        fault = await faults.inject_fault(guard=guard, db=db, services=services, body=body)
    except ProblemError as exc:
        if exc.status != 404:
            raise
        return await faults_view(request, guard, db, services, entered=entered, errors={
            "checkpoint_id": f"No checkpoint has the id {body.checkpoint_id!r}: copy it from"
                             " the Deployments or Models page."})
    return redirect(request, "/faults", notice=(
        "success", f"Fault injected as {principal.name}: {fault.checkpoint_id} is served at"
                   f" temperature {fault.temperature:g} until an operator clears it."))


@router.post("/faults/clear")
async def clear(request: Request, principal: CsrfChecked, services: ServicesDep) -> Response:
    """Clear every serving fault for an operator (the policy decides; audited)."""
    guard = Guard(services, principal, refused_input=await field_with_nul(request))
    request.state.guard = guard
    cleared = await faults.clear_faults(guard=guard, services=services)
    return redirect(request, "/faults", notice=(
        "success", f"Cleared {cleared.cleared} serving fault"
                   f"{'' if cleared.cleared == 1 else 's'} as {principal.name}."))
