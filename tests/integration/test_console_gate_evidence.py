"""The promotion page reads like an analysis: a verdict in words first, one row per check
(measured, bar, result), only the gate's thresholds, raw JSON behind a toggle; a gate that
waits for production traffic says so."""

from __future__ import annotations

import html
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from sqlalchemy import Engine

from governance_loop.gates.shadow import ShadowSample, decide_shadow
from governance_loop.gates.thresholds import ThresholdSpec
from tests.factories_web import Person, add_gate, make_promotion
from tests.integration.console_client import console_session

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]

SPEC = ThresholdSpec.from_mapping({"version": "t-9", "min_success_rate": 0.6,
                                   "max_regression_vs_production": 0.05, "min_samples": 50,
                                   "shadow": {"min_samples": 12}})


@pytest_asyncio.fixture(loop_scope="session")
async def console(web_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=web_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


@pytest.mark.asyncio(loop_scope="session")
async def test_a_shadow_gate_starved_of_traffic_reads_as_such(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            status="failed", current_gate="shadow")
    add_gate(owner_engine, seeded.promotion_id, "offline_eval", with_threshold=True)
    starved = decide_shadow([ShadowSample("e1", 3, 3, 1.0, 1.0)], SPEC)
    add_gate(owner_engine, seeded.promotion_id, "shadow", passed=False,
             evidence=starved.evidence)
    await console_session(console, people["operator"])
    page = html.unescape((await console.get(f"/promotions/{seeded.promotion_id}")).text)
    shadow = page.split('data-testid="verdict-shadow"', 1)[1].split('<li class="gate', 1)[0]
    verdict = shadow.split("</p>", 1)[0]
    assert "did not see enough production traffic: 1, needs 12" in verdict
    row = shadow.split("Paired production episodes", 1)[1].split("</tr>", 1)[0]
    assert ">1<" in row and "≥ 12" in row and ">inconclusive<" in row
    assert "<summary>Raw evidence (JSON)</summary>" in shadow
    thresholds = shadow.split("Thresholds for this gate", 1)[1].split("</details>", 1)[0]
    assert "agreement_floor" in thresholds and "min_success_rate" not in thresholds
    # The flattened dump is gone: no dotted evidence keys as table rows.
    assert "reward_delta.estimate" not in page


@pytest.mark.asyncio(loop_scope="session")
async def test_an_open_shadow_gate_says_it_waits_for_production_traffic(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            current_gate="shadow")
    add_gate(owner_engine, seeded.promotion_id, "offline_eval", with_threshold=True)
    await console_session(console, people["auditor"])
    page = html.unescape((await console.get(f"/promotions/{seeded.promotion_id}")).text)
    note = page.split('data-testid="waiting-for-traffic"', 1)[1].split("</p>", 1)[0]
    assert "Waiting for production traffic" in note and "POST /api/episodes" in note
