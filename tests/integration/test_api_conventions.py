"""API conventions (issue 16): named operationIds, only the errors a route can return,
rollback as a deployment's sub-resource (the old path a deprecated alias), enum status
filters, and /docs that works offline."""

from __future__ import annotations

import re

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import Engine
from temporalio.client import Client

from tests.factories import make_checkpoint, uid
from tests.factories_web import Person, assert_problem, make_deployment
from tests.integration.test_api_deployments import loops  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]

CAMEL_CASE = re.compile(r"^[a-z]+([A-Z][a-z0-9]*)*$")


def _operations(app: FastAPI) -> dict[tuple[str, str], dict[str, object]]:
    return {(method.upper(), path): operation
            for path, methods in app.openapi()["paths"].items()
            for method, operation in methods.items()}


def test_every_operation_has_a_unique_named_operation_id(web_app: FastAPI) -> None:
    ids = [op["operationId"] for op in _operations(web_app).values()]
    assert len(ids) == len(set(ids))
    assert all(CAMEL_CASE.match(str(i)) for i in ids), ids
    assert _operations(web_app)[("GET", "/api/checkpoints/{checkpoint_id}/lineage")][
        "operationId"] == "getLineage"


def test_operations_document_only_the_errors_they_can_return(web_app: FastAPI) -> None:
    ops = _operations(web_app)

    def errors(method: str, path: str) -> set[str]:
        responses = ops[(method, path)]["responses"]
        assert isinstance(responses, dict)
        return {s for s in responses if s[0] in "45"}

    assert errors("GET", "/api/runs") == {"401", "403", "422", "503"}
    assert errors("GET", "/api/runs/{run_id}") == {"401", "403", "404", "422", "503"}
    # Only routes that ask a loop's workflow wait for a worker (504).
    assert "504" in errors("POST", "/api/runs/{run_id}/pause")
    assert "504" not in errors("POST", "/api/tokens")
    assert errors("GET", "/healthz") == set()
    assert "409" in errors("GET", "/api/deployments/{alias}/rollback-preview")


async def test_rollback_is_a_sub_resource_of_the_deployment(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person],
    loops: Client,  # noqa: F811
) -> None:
    alias = uid("alias-").lower()
    make_deployment(owner_engine, alias, make_checkpoint(owner_engine),
                    make_checkpoint(owner_engine))
    operator = people["operator"].headers
    done = await api.post(f"/api/deployments/{alias}/rollback", headers=operator,
                          json={"reason": "p99 regression"})
    assert done.status_code == 200, done.text
    assert done.json()["alias"] == alias and "deprecation" not in done.headers
    old = await api.post("/api/rollback", headers=operator,
                         json={"alias": alias, "reason": "again, the old way"})
    assert old.status_code == 200 and old.headers["deprecation"] == "true"
    assert f"</api/deployments/{alias}/rollback>" in old.headers["link"]
    assert _operations_deprecated(api, "/api/rollback")
    # Refusals on the new path: no such alias, not an operator, both targets named.
    assert_problem(await api.post("/api/deployments/no-such-alias/rollback", headers=operator,
                                  json={"reason": "x"}), 404)
    assert_problem(await api.post(f"/api/deployments/{alias}/rollback",
                                  headers=people["auditor"].headers, json={"reason": "x"}),
                   403, "rollback")
    assert_problem(await api.post(f"/api/deployments/{alias}/rollback", headers=operator,
                                  json={"reason": "x", "to_revision": 1,
                                        "to_checkpoint_id": "abc"}), 422, "not both")


def _operations_deprecated(api: httpx.AsyncClient, path: str) -> bool:
    app = api._transport.app  # type: ignore[attr-defined]
    return bool(app.openapi()["paths"][path]["post"].get("deprecated"))


async def test_status_filters_are_enums(
    api: httpx.AsyncClient, people: dict[str, Person], web_app: FastAPI
) -> None:
    headers = people["operator"].headers
    for path in ("/api/runs", "/api/promotions", "/api/tasks", "/api/role-grants"):
        assert_problem(await api.get(path, params={"status": "bogus"}, headers=headers),
                       422, "status")
    runs = _operations(web_app)[("GET", "/api/runs")]["parameters"]
    assert isinstance(runs, list)
    status = next(p for p in runs if p["name"] == "status")
    assert "#/components/schemas/RunStatus" in str(status["schema"])
    enum = web_app.openapi()["components"]["schemas"]["RunStatus"]["enum"]
    assert "completed_with_alarms" in enum


async def test_docs_are_served_from_the_vendored_swagger_ui(api: httpx.AsyncClient) -> None:
    page = await api.get("/docs")
    assert page.status_code == 200
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sources and all(s.startswith("/static/vendor/swagger-ui/") for s in sources), sources
    for source in sources:
        asset = await api.get(source)
        assert asset.status_code == 200 and len(asset.content) > 0, source
