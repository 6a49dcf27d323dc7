"""Read routes: authentication, authorization per role, 404s, pagination and problem documents."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import Engine, text

from tests.factories import make_run
from tests.factories_web import Person, add_gate, add_steps, assert_problem, make_promotion

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


async def test_healthz_needs_no_auth(api: httpx.AsyncClient) -> None:
    response = await api.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer tl_not-a-token"},
                                     {"Authorization": "Basic abc"}])
async def test_unauthenticated_is_401_problem(
    api: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    response = await api.get("/api/runs", headers=headers)
    assert_problem(response, 401)


async def test_me_shows_roles(api: httpx.AsyncClient, people: dict[str, Person]) -> None:
    response = await api.get("/api/me", headers=people["auditor"].headers)
    assert response.status_code == 200
    assert response.json()["roles"] == ["auditor"]
    assert "token" not in response.text and "token_hash" not in response.text


async def test_run_detail_has_metrics_and_alarms(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    run_id = make_run(owner_engine, submitted_by=people["engineer"].name)
    add_steps(owner_engine, run_id, 6, alarm_at=4)
    response = await api.get(f"/api/runs/{run_id}", headers=people["engineer2"].headers)
    assert response.status_code == 200
    body = response.json()
    assert [m["iteration"] for m in body["metrics"]] == list(range(6))
    assert body["alarms"] == [{"iteration": 4, "name": "echo_trap"}]
    metrics = await api.get(f"/api/runs/{run_id}/metrics?after=3",
                            headers=people["engineer"].headers)
    assert [m["iteration"] for m in metrics.json()["metrics"]] == [4, 5]


async def test_run_metrics_return_the_keyed_series(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    run_id = make_run(owner_engine, submitted_by=people["engineer"].name)
    add_steps(owner_engine, run_id, 2)
    series = {"reward/task/t1": 0.25, "reward/env/frozen_lake": 0.5,
              "dynamic_sampling/drop_rate": 0.75}
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE training_step SET metrics = CAST(:m AS jsonb)"
                          " WHERE run_id = :r AND iteration = 1"),
                     {"m": json.dumps({"series": series}), "r": run_id})
    response = await api.get(f"/api/runs/{run_id}/metrics", headers=people["engineer"].headers)
    assert response.status_code == 200
    assert [m["extra_metrics"] for m in response.json()["metrics"]] == [{}, series]


@pytest.mark.parametrize("path", [
    "/api/runs/nope", "/api/runs/nope/metrics", "/api/checkpoints/nope",
    "/api/checkpoints/nope/lineage", "/api/environments/nope",
    "/api/environments/nope/diff?a=1&b=2", "/api/environment-versions/nope", "/api/tasks/nope",
    "/api/eval-sets/nope",
    "/api/thresholds/nope", "/api/promotions/nope", "/api/deployments/nope",
])
async def test_unknown_ids_are_404(
    api: httpx.AsyncClient, people: dict[str, Person], path: str
) -> None:
    assert_problem(await api.get(path, headers=people["auditor"].headers), 404, "nope")


async def test_pagination_walks_every_run_once(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    owner = people["engineer2"].name
    made = {make_run(owner_engine, submitted_by=owner) for _ in range(5)}
    seen: list[str] = []
    cursor: str | None = None
    while True:
        params: dict[str, str | int] = {"limit": 2, "submitted_by": owner}
        if cursor:
            params["cursor"] = cursor
        response = await api.get("/api/runs", params=params, headers=people["operator"].headers)
        page = response.json()
        assert len(page["items"]) <= 2
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert made <= set(seen) and len(seen) == len(set(seen))


@pytest.mark.parametrize("cursor", ["garbage", "W10", "WyJ4Il0", "eyJhIjoxfQ"])
async def test_a_cursor_we_did_not_issue_is_422(
    api: httpx.AsyncClient, people: dict[str, Person], cursor: str
) -> None:
    response = await api.get("/api/runs", params={"cursor": cursor},
                             headers=people["operator"].headers)
    assert_problem(response, 422, "cursor")


async def test_bad_query_parameters_are_422(
    api: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    body = assert_problem(await api.get("/api/runs?limit=0", headers=people["operator"].headers),
                          422, "limit")
    assert body["reasons"]
    assert_problem(await api.get("/api/environments/x/diff?a=one&b=2",
                                 headers=people["operator"].headers), 422)


async def test_wrong_role_is_403_with_the_policy_reasons(
    api: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    # Admins manage users; they read neither runs nor promotions.
    body = assert_problem(await api.get("/api/runs", headers=people["admin"].headers), 403,
                          "no rule lets")
    assert body["reasons"]
    # ML engineers never read the audit log or approvals.
    assert_problem(await api.get("/api/audit/events", headers=people["engineer"].headers), 403)


async def test_engineers_see_promotions_but_not_approvals(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name)
    add_gate(owner_engine, seeded.promotion_id, "offline_eval", with_threshold=True)
    as_engineer = (await api.get(f"/api/promotions/{seeded.promotion_id}",
                                 headers=people["engineer"].headers)).json()
    assert as_engineer["approvals"] is None
    as_auditor = (await api.get(f"/api/promotions/{seeded.promotion_id}",
                                headers=people["auditor"].headers)).json()
    assert as_auditor["approvals"] == []
    gate = as_auditor["gates"][0]
    assert gate["threshold_spec"] == {"min_success_rate": 0.6, "min_samples": 50}
    assert gate["eval_set_id"] and gate["evidence"]["episodes"] == 64


async def test_lineage_is_the_parent_chain_root_first(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name)
    add_gate(owner_engine, seeded.promotion_id, "offline_eval", with_threshold=True)
    response = await api.get(f"/api/checkpoints/{seeded.checkpoint_id}/lineage",
                             headers=people["auditor"].headers)
    body = response.json()
    assert [n["checkpoint"]["id"] for n in body["chain"]] == [
        seeded.root_id, seeded.parent_id, seeded.checkpoint_id]
    assert body["chain"][1]["run"]["id"] == seeded.run_id
    assert body["chain"][2]["environments"][0]["id"] == seeded.env_version_id
    assert [p["id"] for p in body["promotions"]] == [seeded.promotion_id]
    assert len(body["eval_sets"]) == 1 and body["eval_sets"][0]["content_hash"] is None
