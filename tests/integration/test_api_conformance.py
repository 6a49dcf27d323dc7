"""What schemathesis found (issue 19): 405 without ``Allow``, 401 without a challenge, lenient
integers, and inputs the schema accepted but the server refused (or the other way round)."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.factories import make_run
from tests.factories_web import Person, assert_problem

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


def _operations(app: FastAPI) -> dict[str, set[str]]:
    return {path: {m.upper() for m in methods} for path, methods in app.openapi()["paths"].items()}


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


async def test_an_undeclared_method_gets_405_with_allow_on_every_path(
    api: httpx.AsyncClient, web_app: FastAPI, people: dict[str, Person]
) -> None:
    for path, documented in _operations(web_app).items():
        response = await api.request("TRACE", _concrete(path), headers=people["auditor"].headers)
        assert_problem(response, 405)
        allowed = {m.strip() for m in response.headers["allow"].split(",")}
        expected = documented | ({"HEAD"} if "GET" in documented else set())
        assert allowed == expected, path


async def test_every_operation_without_credentials_gets_a_bearer_challenge(
    api: httpx.AsyncClient, web_app: FastAPI
) -> None:
    for path, methods in _operations(web_app).items():
        if path == "/healthz":
            continue
        for method in methods:
            response = await api.request(method, _concrete(path), json={})
            assert_problem(response, 401)
            assert response.headers["www-authenticate"].startswith("Bearer realm="), path


@pytest.mark.parametrize("value", ["1.0", "+1", " 1", "1_000", "1e0", "0x1"])
async def test_integers_in_the_query_are_digits_only(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Any, value: str
) -> None:
    engineer = people["engineer"]
    run_id = make_run(owner_engine, submitted_by=engineer.name)
    metrics = await api.get(f"/api/runs/{run_id}/metrics", params={"after": value},
                            headers=engineer.headers)
    assert_problem(metrics, 422, "digits only")
    assert_problem(await api.get("/api/runs", params={"limit": value}, headers=engineer.headers),
                   422, "digits only")
    plain = await api.get(f"/api/runs/{run_id}/metrics", params={"after": "-1"},
                          headers=engineer.headers)
    assert plain.status_code == 200


async def test_schema_and_server_agree_on_what_is_refused(
    api: httpx.AsyncClient, web_app: FastAPI, people: dict[str, Person]
) -> None:
    schema = web_app.openapi()
    # A run is submitted as exactly one of config or config_yaml; {} is schema-invalid too.
    assert schema["components"]["schemas"]["RunSubmit"]["oneOf"] == [
        {"required": ["config"]}, {"required": ["config_yaml"]}]
    assert_problem(await api.post("/api/runs", json={}, headers=people["engineer"].headers),
                   422, "exactly one")
    # Path and query strings are documented NUL-free, as the service enforces.
    run_id = schema["paths"]["/api/runs/{run_id}"]["get"]["parameters"][0]["schema"]
    assert run_id["pattern"] == "^[^\\u0000]*$"
    # A cursor is base64url: anything else is refused by the schema, not just by the server.
    cursor = next(p for p in schema["paths"]["/api/runs"]["get"]["parameters"]
                  if p["name"] == "cursor")
    assert cursor["schema"]["anyOf"][0]["pattern"] == "^[A-Za-z0-9_-]+$"
    assert_problem(await api.get("/api/runs?cursor=%2F%2F", headers=people["engineer"].headers),
                   422, "pattern")


def test_the_openapi_schema_documents_run_yaml(web_app: FastAPI) -> None:
    from triloop.run_config import RolloutSection

    schemas = web_app.openapi()["components"]["schemas"]
    config = schemas["RunSubmit"]["properties"]["config"]["anyOf"][0]
    assert config == {"$ref": "#/components/schemas/RunConfig"}
    documented = schemas["RolloutSection"]["properties"]["max_new_tokens"]["description"]
    assert documented == RolloutSection.model_fields["max_new_tokens"].description
    assert "inference backend" in documented


@pytest.mark.parametrize("comment", ["\x1f", "\ufeff", "\x85 \u3000", "\t\n"])
def test_a_blank_comment_is_blank_for_the_schema_pydantic_and_python_alike(
    web_app: FastAPI, comment: str
) -> None:
    from pydantic import ValidationError

    from web.actions import NOT_BLANK, DecisionRequest

    documented = web_app.openapi()["components"]["schemas"]["DecisionRequest"]
    pattern = documented["properties"]["comment"]["pattern"]
    assert pattern == NOT_BLANK and re.search(pattern, comment) is None
    with pytest.raises(ValidationError):
        DecisionRequest(comment=comment)
    assert DecisionRequest(comment=comment + "ok").comment.endswith("ok")
