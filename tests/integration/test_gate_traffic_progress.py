"""An open shadow or canary gate says, in the API and the console, how much production
traffic it has counted against its threshold ("waiting for production traffic: 3 of 12
paired episodes"), counting what the gate itself counts: requested episodes since it took
its routing slot."""

from __future__ import annotations

import html
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import Engine

from tests.factories_traffic import (
    hold_slot,
    promotion_at_gate,
    task_of,
    write_served,
    write_shadow_pairs,
)
from tests.factories_web import Person, make_promotion
from tests.integration.console_client import console_session

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]

SHADOW_12 = {"shadow": {"min_samples": 12}}


@pytest.fixture
def free_slots(owner_engine: Engine) -> Iterator[None]:
    """Routing is one table for the whole database: give the slots back after each test."""
    yield
    hold_slot(owner_engine, "shadow", None)
    hold_slot(owner_engine, "canary", None)


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.usefixtures("free_slots")
async def test_an_open_shadow_gate_counts_its_paired_episodes_in_api_and_console(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = promotion_at_gate(owner_engine, people, "shadow", SHADOW_12)
    task_id = task_of(owner_engine, seeded)
    write_shadow_pairs(owner_engine, seeded, task_id, 2)  # before the gate's slot: not counted
    hold_slot(owner_engine, "shadow", seeded)
    write_shadow_pairs(owner_engine, seeded, task_id, 3)
    write_served(owner_engine, seeded.root_id, "production", task_id, 4)  # unpaired: not counted

    response = await api.get(f"/api/promotions/{seeded.promotion_id}",
                             headers=people["operator"].headers)
    assert response.status_code == 200, response.text
    traffic = response.json()["traffic"]
    assert traffic["gate"] == "shadow" and traffic["slot_held"] is True
    assert (traffic["counted"], traffic["needed"], traffic["enough"]) == (3, 12, False)
    assert traffic["message"] == "waiting for production traffic: 3 of 12 paired episodes"

    await console_session(api, people["auditor"])
    page = html.unescape((await api.get(f"/promotions/{seeded.promotion_id}")).text)
    api.cookies.clear()
    note = page.split('data-testid="traffic-progress"', 1)[1].split("</p>", 1)[0]
    assert "Waiting for production traffic: 3 of 12 paired episodes" in note


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.usefixtures("free_slots")
async def test_an_open_canary_gate_counts_the_smaller_arm(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = promotion_at_gate(owner_engine, people, "canary",
                               {"canary": {"min_samples_per_arm": 4}})
    task_id = task_of(owner_engine, seeded)
    hold_slot(owner_engine, "canary", seeded)
    write_served(owner_engine, seeded.checkpoint_id, "canary", task_id, 2)
    write_served(owner_engine, seeded.root_id, "production", task_id, 5)

    traffic = (await api.get(f"/api/promotions/{seeded.promotion_id}",
                             headers=people["operator"].headers)).json()["traffic"]
    assert traffic["arms"] == {"canary": 2, "production": 5}
    assert (traffic["counted"], traffic["needed"]) == (2, 4)
    assert traffic["message"].startswith("waiting for production traffic: 2 of 4 episodes")

    write_served(owner_engine, seeded.checkpoint_id, "canary", task_id, 3)
    traffic = (await api.get(f"/api/promotions/{seeded.promotion_id}",
                             headers=people["operator"].headers)).json()["traffic"]
    assert (traffic["counted"], traffic["enough"]) == (5, True)
    assert traffic["message"].startswith("production traffic is enough: 5 of 4")


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.usefixtures("free_slots")
async def test_a_gate_waiting_for_its_slot_counts_nothing_and_other_gates_have_no_count(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    holder = promotion_at_gate(owner_engine, people, "shadow", SHADOW_12)
    waiting = promotion_at_gate(owner_engine, people, "shadow", SHADOW_12)
    hold_slot(owner_engine, "shadow", holder)
    # Its own pairs, yet it does not hold the slot: nothing counts.
    write_shadow_pairs(owner_engine, waiting, task_of(owner_engine, waiting), 3)

    traffic = (await api.get(f"/api/promotions/{waiting.promotion_id}",
                             headers=people["operator"].headers)).json()["traffic"]
    assert traffic["slot_held"] is False and traffic["counted"] == 0
    assert traffic["slot_holder"] == holder.promotion_id
    assert f"held by promotion {holder.promotion_id}" in traffic["message"]

    at_approval = make_promotion(owner_engine, submitted_by=people["engineer"].name)
    body = (await api.get(f"/api/promotions/{at_approval.promotion_id}",
                          headers=people["operator"].headers)).json()
    assert body["traffic"] is None


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.usefixtures("free_slots")
async def test_an_open_canary_with_enough_traffic_does_not_also_say_it_waits(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    """The page once said "traffic is enough" beside "waiting for production traffic": the
    waiting note ignored the count. Now one notice comes from the one count."""
    seeded = promotion_at_gate(owner_engine, people, "canary",
                               {"canary": {"min_samples_per_arm": 4}})
    task_id = task_of(owner_engine, seeded)
    hold_slot(owner_engine, "canary", seeded)
    write_served(owner_engine, seeded.checkpoint_id, "canary", task_id, 4)
    write_served(owner_engine, seeded.root_id, "production", task_id, 6)

    await console_session(api, people["operator"])
    page = html.unescape((await api.get(f"/promotions/{seeded.promotion_id}")).text)
    api.cookies.clear()
    notice = page.split('data-testid="gate-waiting"', 1)[1].split("</div>", 1)[0]
    assert "Production traffic is enough: 4 of 4 episodes in the smaller arm" in notice
    assert "notice-info" in page.split('data-testid="gate-waiting"', 1)[0].rsplit("<div", 1)[1]
    assert "Waiting for production traffic" not in page
    assert 'data-testid="waiting-for-traffic"' not in page
