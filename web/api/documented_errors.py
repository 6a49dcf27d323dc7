"""Which error statuses each operation documents: only those it can return.

Most follow from the route's shape, so they are derived here rather than repeated on
every route; a route declares the rest itself (``responses=errors(...)``), such as
409/504 from a loop's workflow or 404 for an id named in the body.

- every ``/api`` route: 401 (no valid credentials), 403 (the policy refused), 422 (a field
  holds a NUL, or does not match the schema), 503 (PostgreSQL unreachable: every decision
  is audited there);
- a route with a body: 400 (not JSON) and 413 (too large);
- a route with a path parameter: 404;
- a write (POST, PUT, PATCH, DELETE): 409 (the change conflicts with stored data).
"""

from __future__ import annotations

from typing import Any

from fastapi.routing import APIRoute

from web.api.common import ERRORS
from web.problems import PROBLEM_MEDIA_TYPE, Problem

UNAUTHENTICATED_PATHS = frozenset({"/healthz"})
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """Problem responses for these statuses, to declare on a route."""
    return {status: ERRORS[status] for status in statuses}


# A route that asks a loop's workflow (through Temporal) can also be refused by it (409),
# find Temporal unreachable (503) or wait for a worker in vain (504).
WORKFLOW_ERRORS = errors(409, 503, 504)


def derived_statuses(route: APIRoute) -> set[int]:
    """The error statuses that follow from the route's shape."""
    if route.path in UNAUTHENTICATED_PATHS:
        return set()
    statuses = {401, 403, 422, 503}
    if route.body_field is not None:
        statuses |= {400, 413}
    if route.dependant.path_params:
        statuses.add(404)
    if (route.methods or set()) & WRITE_METHODS:
        statuses.add(409)
    return statuses


def document_errors(schema: dict[str, Any], routes: list[Any]) -> None:
    """Give each operation exactly its derived and declared problem responses."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.setdefault("Problem", Problem.model_json_schema(
        ref_template="#/components/schemas/{model}"))
    for route in routes:
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        declared = {int(s) for s in route.responses if str(s).isdigit() and int(s) >= 400}
        wanted = derived_statuses(route) | declared
        for method in route.methods or ():
            operation = schema["paths"].get(route.path_format, {}).get(method.lower())
            if operation is None:
                continue
            responses = operation.setdefault("responses", {})
            for status in list(responses):
                if status[0] in "45" and int(status) not in wanted:
                    del responses[status]
            for status in sorted(wanted):
                responses[str(status)] = _problem_response(status)


def _problem_response(status: int) -> dict[str, Any]:
    return {
        "description": ERRORS[status]["description"],
        "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }


def operation_id(route: APIRoute) -> str:
    """A named operationId: the route function's name in lowerCamelCase (``listRuns``)."""
    first, *rest = route.name.split("_")
    return first + "".join(word.capitalize() for word in rest)
