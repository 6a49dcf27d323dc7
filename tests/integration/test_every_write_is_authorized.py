"""Every write route of the API asks ``authorize()`` before it changes anything.

The walk covers every non-GET operation the app registers: a route added without an
entry here fails the test. The app's authorizer points at an OPA that is not there,
so every decision fails closed; each request must be refused with 403 *after* a
recorded policy decision, and no table may change. Console forms post to the same
``web.actions`` functions as these routes (checked at the end).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from sqlalchemy import Engine, text

from tests.factories import make_task
from tests.factories_task_sets import make_task_set
from tests.factories_web import add_token, admitted_task, make_promotion, make_user
from triloop.config import Settings
from triloop.faults import read_serving_faults
from triloop.policy import Actor, Authorizer, Decision, OpaClient, Resource

pytestmark = pytest.mark.integration

WRITE_TABLES = ("app_user", "api_token", "training_run", "approval", "deployment", "routing",
                "trajectory", "human_decision", "promotion", "gate_result", "checkpoint",
                "proposal", "role_grant", "environment", "environment_version", "eval_set",
                "eval_item", "threshold", "task_set", "task_set_member", "task", "webhook",
                "webhook_delivery")
NOT_ACTIONS = {"/login", "/logout"}  # authentication itself, before any identity exists


class RecordingSink:
    """Keeps every decision instead of writing it (the test is about who asked)."""

    def __init__(self) -> None:
        self.decisions: list[tuple[str, str, bool]] = []

    def __call__(self, actor: Actor, action: str, resource: Resource, decision: Decision,
                 context: Mapping[str, Any] | None) -> None:
        del actor, context
        self.decisions.append((action, resource.kind, decision.allow))


@pytest.fixture(scope="module")
def sink() -> RecordingSink:
    return RecordingSink()


@pytest.fixture(scope="module")
def closed_app(settings: Settings, sink: RecordingSink) -> FastAPI:
    from web.app import create_app

    dead = settings.model_copy(update={"opa_url": "http://127.0.0.1:9"})
    app = create_app(dead, temporal_timeout_s=5.0)
    app.state.services.authorizer = Authorizer(OpaClient(dead.opa_url, timeout_s=0.5), sink)
    return app


@pytest_asyncio.fixture(loop_scope="session")
async def client(closed_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=closed_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as api:
        yield api


def _requests(owner_engine: Engine) -> dict[tuple[str, str], tuple[str, dict[str, Any]]]:
    """(method, route) -> (concrete path, JSON body) of a request that is otherwise valid."""
    submitter = make_user(owner_engine, "ml_engineer")
    seeded = make_promotion(owner_engine, submitted_by=submitter.name, current_gate="audit")
    run, promo = seeded.run_id, seeded.promotion_id
    with owner_engine.begin() as conn:  # a production alias with a rollback target to return to
        conn.execute(text(
            "INSERT INTO deployment (alias, checkpoint_id, rollback_target_id, updated_by) "
            "VALUES ('production', :c, :t, 'governance') ON CONFLICT (alias) DO NOTHING"),
            {"c": seeded.checkpoint_id, "t": seeded.parent_id})
    comment = {"comment": "looked at the evidence"}
    pending = make_task(owner_engine, status="pending")
    pending_set = make_task_set(owner_engine).id
    token_id = add_token(owner_engine, submitter.name, "tl_walk-" + submitter.name)
    grant_id = "walk-" + submitter.name
    with owner_engine.begin() as conn:  # a pending grant another admin could decide
        conn.execute(text(
            "INSERT INTO role_grant (id, user_name, role, requested_by) "
            "VALUES (:g, :u, 'operator', 'someone-else')"), {"g": grant_id, "u": submitter.name})
    config = {"name": "walk", "model": {"base": seeded.root_id},
              "rollout": {"task_ids": [admitted_task(owner_engine)]}}
    return {
        ("POST", "/api/users"): ("/api/users", {"name": "walker", "roles": ["operator"]}),
        ("POST", "/api/users/{name}/roles"):
            (f"/api/users/{submitter.name}/roles", {"role": "auditor"}),
        ("POST", "/api/role-grants/{grant_id}/confirm"):
            (f"/api/role-grants/{grant_id}/confirm", {}),
        ("POST", "/api/role-grants/{grant_id}/refuse"):
            (f"/api/role-grants/{grant_id}/refuse", {}),
        ("POST", "/api/tokens"): ("/api/tokens", {"label": "walk"}),
        ("POST", "/api/tokens/{token_id}/revoke"): (f"/api/tokens/{token_id}/revoke", {}),
        ("POST", "/api/runs"): ("/api/runs", {"config": config}),
        ("POST", "/api/runs/{run_id}/pause"): (f"/api/runs/{run}/pause", {}),
        ("POST", "/api/runs/{run_id}/resume"): (f"/api/runs/{run}/resume", {}),
        ("POST", "/api/runs/{run_id}/cancel"): (f"/api/runs/{run}/cancel", {}),
        ("POST", "/api/runs/{run_id}/placebo"): (f"/api/runs/{run}/placebo", {}),
        ("POST", "/api/promotions/{promotion_id}/sign-audit"):
            (f"/api/promotions/{promo}/sign-audit", comment),
        ("POST", "/api/promotions/{promotion_id}/reject-audit"):
            (f"/api/promotions/{promo}/reject-audit", comment),
        ("POST", "/api/promotions/{promotion_id}/approve"):
            (f"/api/promotions/{promo}/approve", comment),
        ("POST", "/api/promotions/{promotion_id}/reject"):
            (f"/api/promotions/{promo}/reject", comment),
        ("POST", "/api/promotions/{promotion_id}/override-alarms"):
            (f"/api/promotions/{promo}/override-alarms", comment),
        ("POST", "/api/rollback"): ("/api/rollback", {"reason": "game day"}),
        ("POST", "/api/deployments/{alias}/rollback"):
            ("/api/deployments/production/rollback", {"reason": "game day"}),
        ("POST", "/api/episodes"):
            ("/api/episodes", {"items": [{"task_id": admitted_task(owner_engine), "seed": 1}]}),
        ("POST", "/api/audit/verify"): ("/api/audit/verify", {}),
        ("POST", "/api/tasks/{task_id}/admission"):
            (f"/api/tasks/{pending}/admission", {"decision": "approve", **comment}),
        ("POST", "/api/task-sets/{task_set_id}/admission"):
            (f"/api/task-sets/{pending_set}/admission", {"decision": "approve", **comment}),
        ("POST", "/api/faults"):
            ("/api/faults", {"checkpoint_id": seeded.checkpoint_id, "temperature": 4}),
        ("DELETE", "/api/faults"): ("/api/faults", {}),
        ("POST", "/api/webhooks"): ("/api/webhooks", {"url": "https://hooks.example/walk"}),
        ("DELETE", "/api/webhooks/{webhook_id}"): ("/api/webhooks/wh-walk", {}),
        ("POST", "/api/environments"):
            ("/api/environments", {"name": "walk", "contract_yaml": "task: frozen_lake\n"}),
        ("POST", "/api/eval-sets"):
            ("/api/eval-sets", {"name": "walk", "task_ids": [admitted_task(owner_engine)]}),
        ("POST", "/api/model-imports"):
            ("/api/model-imports", {"source": "/models/walk", "name": "walk"}),
        ("POST", "/api/thresholds"):
            ("/api/thresholds", {"name": "walk", "eval_set": "walk", "spec": {}}),
        ("POST", "/api/task-sets"):
            ("/api/task-sets", {"name": "walk", "environment": "frozen_lake@1", "seeds": [1],
                                "split": {"by": "fraction", "train": 1.0}}),
    }


def _counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        counts = {t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one())
                  for t in WRITE_TABLES}
        counts["pending role_grant"] = int(conn.execute(text(  # a decision leaves no new row
            "SELECT count(*) FROM role_grant WHERE status = 'pending'")).scalar_one())
        return counts


async def test_every_write_route_asks_the_policy_first(
    closed_app: FastAPI, client: httpx.AsyncClient, sink: RecordingSink, owner_engine: Engine,
    settings: Settings,
) -> None:
    registered = {(method.upper(), path) for path, methods in closed_app.openapi()["paths"].items()
                  for method in methods if method != "get"}
    requests = _requests(owner_engine)
    assert registered - set(requests) == set(), "write routes missing from this walk"
    everyone = make_user(owner_engine, "ml_engineer", "operator", "auditor", "admin")
    before = _counts(owner_engine)
    faults_before = read_serving_faults(settings.home)
    for (method, route), (path, body) in sorted(requests.items()):
        asked = len(sink.decisions)
        response = await client.request(method, path, json=body, headers={
            "Authorization": f"Bearer {everyone.token}"})
        assert response.status_code == 403, (route, response.status_code, response.text)
        assert "failed closed" in response.text, (route, response.text)
        assert len(sink.decisions) > asked, f"{method} {route} answered without asking OPA"
        assert not any(allow for _, _, allow in sink.decisions[asked:])
    assert _counts(owner_engine) == before
    assert read_serving_faults(settings.home) == faults_before  # no fault injected or cleared


def test_console_forms_use_the_same_authorized_actions() -> None:
    from fastapi.routing import APIRoute

    from web.console import PAGE_MODULES

    console_posts = [r for module in PAGE_MODULES
                     for r in module.router.routes
                     if isinstance(r, APIRoute) and "POST" in r.methods
                     and r.path not in NOT_ACTIONS]
    assert len(console_posts) >= 3, "the console's forms were not found"
    for route in console_posts:
        source = inspect.getsource(route.endpoint)
        assert ("actions." in source or "guard(" in source
                or _delegates_to_an_authorizing_function(route.endpoint, source)), (
            f"console POST {route.path} neither calls web.actions nor authorizes")


def _delegates_to_an_authorizing_function(endpoint: Any, source: str) -> bool:
    """The page hands its guard to a shared web function (the one its API route calls too)
    that asks the policy itself."""
    import re
    import sys

    namespace = sys.modules[endpoint.__module__].__dict__
    for module_name, function_name in re.findall(r"\b(\w+)\.(\w+)\(guard=guard", source):
        function = getattr(namespace.get(module_name), function_name, None)
        if function is not None and "await guard(" in inspect.getsource(function):
            return True
    return False
