"""``GET /metrics``: the web service's Prometheus metrics (policy decisions, audit appends).

Not a person's API: a scraper is no person, so it signs in with no user token. It presents
the metrics token instead, or, when none is configured, must be a loopback client
(``triloop.metrics.scrape_refusal``, the same rule as every worker's /metrics). Left out
of the OpenAPI document: its body is Prometheus' text format, not JSON.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from triloop.metrics import render, scrape_refusal
from web.deps import ServicesDep
from web.problems import ProblemError

router = APIRouter(tags=["metrics"])


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request, services: ServicesDep) -> Response:
    """This process's metrics, for a scraper with the metrics token (or on loopback)."""
    refusal = scrape_refusal(authorization=request.headers.get("authorization"),
                             client_host=request.client.host if request.client else None,
                             token=services.settings.metrics_scrape_token())
    if refusal is not None:
        if refusal.status == 401:
            raise ProblemError(401, "Unauthenticated", refusal.reason,
                               headers={"WWW-Authenticate": 'Bearer realm="triloop metrics"'})
        raise ProblemError(403, "Forbidden", refusal.reason)
    body, content_type = render()
    return Response(body, media_type=content_type)
