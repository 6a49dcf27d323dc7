"""The console's home page: what serves production, canary and shadow, what waits for this
person (with a count in the nav); alarms are the ML engineers' list. Error pages keep the nav."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from sqlalchemy import Engine, text

from tests.factories import insert, uid
from tests.factories_execution import set_routing
from tests.factories_web import Person, add_approval, ensure_production, make_promotion
from tests.integration.console_client import console_session

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


@pytest_asyncio.fixture(loop_scope="session")
async def console(web_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A browser-like client of its own (its own cookie jar)."""
    transport = httpx.ASGITransport(app=web_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


@pytest.mark.asyncio(loop_scope="session")
async def test_operator_home_shows_production_trials_and_pending_count(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    checkpoint, promotion = ensure_production(owner_engine, people)
    waiting = make_promotion(owner_engine, submitted_by=people["engineer"].name)
    add_approval(owner_engine, waiting.promotion_id, "audit", people["auditor"].name)
    in_canary = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                               current_gate="canary")
    with owner_engine.connect() as conn:
        before = conn.execute(text(
            "SELECT checkpoint_id, share FROM routing WHERE slot = 'canary'")).one_or_none()
    set_routing(owner_engine, "canary", in_canary.checkpoint_id, 0.1)
    insert(owner_engine, "training_step", run_id=waiting.run_id, iteration=3,
           alarms=["echo_trap"], length_stats={}, metrics={})
    try:
        await console_session(console, people["operator"])
        home = (await console.get("/")).text
    finally:
        set_routing(owner_engine, "canary", before[0] if before else None,
                    before[1] if before else 0.0)
    assert "Production now" in home
    assert checkpoint[:16] in home
    if promotion is not None:
        assert f'href="/promotions/{promotion}"' in home
    assert in_canary.checkpoint_id[:16] in home and "10% of production episodes" in home
    waiting_part = home.split('id="waiting-h"', 1)[1]
    assert f'href="/promotions/{waiting.promotion_id}"' in waiting_part
    assert 'data-testid="pending-count"' in home
    # The operator's home has no alarm list: alarms belong to the ML engineers' view.
    assert "Recent alarms" not in home

    await console_session(console, people["engineer"])
    engineer_home = (await console.get("/")).text
    assert "Recent alarms" in engineer_home
    assert 'data-testid="pending-count"' not in engineer_home or \
        f'href="/promotions/{waiting.promotion_id}"' not in engineer_home.split(
            'id="waiting-h"', 1)[1]


@pytest.mark.asyncio(loop_scope="session")
async def test_a_refused_page_keeps_the_nav_of_who_is_signed_in(
    console: httpx.AsyncClient, people: dict[str, Person],
) -> None:
    engineer = people["engineer"]
    await console_session(console, engineer)
    refused = await console.get("/audit", headers={"Accept": "text/html"})
    assert refused.status_code == 403
    assert engineer.name in refused.text and 'aria-label="Main"' in refused.text


@pytest.mark.asyncio(loop_scope="session")
async def test_an_auditors_sign_off_reads_signed_not_approve(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name)
    add_approval(owner_engine, seeded.promotion_id, "audit", people["auditor"].name)
    await console_session(console, people["operator"])
    page = (await console.get(f"/promotions/{seeded.promotion_id}")).text
    signed = page.split('data-testid="decision-audit"', 1)[1].split("</li>", 1)[0]
    assert ">signed</span>" in signed and "approve" not in signed


@pytest.mark.asyncio(loop_scope="session")
async def test_environments_list_shows_the_contracts_description(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    name = uid("described-")
    insert(owner_engine, "environment", name=name, description="", created_by="governance")
    insert(owner_engine, "environment_version", id=uid("sha-"), environment_name=name,
           version=1, contract={"task": "sort", "description": "Sort a list with swaps"},
           contract_text="task: sort\n", fixture_hashes={}, created_by="governance")
    await console_session(console, people["auditor"])
    listing = (await console.get("/environments")).text
    row = listing.split(f'href="/environments/{name}"', 1)[1].split("</tr>", 1)[0]
    assert "Sort a list with swaps" in row
