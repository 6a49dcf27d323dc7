"""An open shadow or canary gate says, in the API and the console, how much production
traffic it has counted against its threshold ("waiting for production traffic: 3 of 12
paired episodes"), counting what the gate itself counts: requested episodes since it took
its routing slot."""

from __future__ import annotations

import html
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text

from tests.factories import insert, uid
from tests.factories_governance import write_episodes
from tests.factories_web import Person, SeededPromotion, make_promotion
from tests.integration.console_client import console_session

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


def _at_gate(engine: Engine, people: dict[str, Person], gate: str,
             spec: dict[str, Any]) -> SeededPromotion:
    """An open promotion at ``gate`` against its root as production, judged by ``spec``."""
    seeded = make_promotion(engine, submitted_by=people["engineer"].name, current_gate=gate)
    with engine.begin() as conn:
        conn.execute(text("UPDATE promotion SET baseline_checkpoint_id = :b WHERE id = :p"),
                     {"b": seeded.root_id, "p": seeded.promotion_id})
    threshold_id = uid("thr-")
    insert(engine, "threshold", id=threshold_id, name=threshold_id, version=1,
           created_by="gov", spec=spec)
    insert(engine, "gate_result", id=uid("gate-"), promotion_id=seeded.promotion_id,
           gate="offline_eval", passed=True, reasons=["passed"], evidence={},
           threshold_id=threshold_id)
    return seeded


def _hold(engine: Engine, slot: str, seeded: SeededPromotion | None) -> None:
    """Route the slot to a promotion's candidate (None empties it), as governance does."""
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO routing (slot, checkpoint_id, share, promotion_id, updated_by, "
            "updated_at) VALUES (:s, :c, 0.1, :p, 'governance', now()) ON CONFLICT (slot) "
            "DO UPDATE SET checkpoint_id = :c, promotion_id = :p, updated_at = now()"),
            {"s": slot, "c": seeded.checkpoint_id if seeded else None,
             "p": seeded.promotion_id if seeded else None})


def _pairs(engine: Engine, seeded: SeededPromotion, task_id: str, n: int) -> None:
    batch = uid("traffic-")
    rows = []
    for i in range(n):
        production = f"{batch}:{i}"
        rows.append({"id": production, "batch_id": batch, "task_id": task_id,
                     "checkpoint_id": seeded.root_id, "purpose": "production",
                     "group_id": production, "success": True})
        rows.append({"id": f"{production}:shadow", "batch_id": batch, "task_id": task_id,
                     "checkpoint_id": seeded.checkpoint_id, "purpose": "shadow",
                     "group_id": production, "success": True,
                     "outcome": {"shadow_of": production}})
    write_episodes(engine, rows)


def _served(engine: Engine, checkpoint_id: str, purpose: str, task_id: str, n: int) -> None:
    batch = uid("traffic-")
    write_episodes(engine, [{"id": f"{batch}:{i}", "batch_id": batch, "task_id": task_id,
                             "checkpoint_id": checkpoint_id, "purpose": purpose,
                             "group_id": f"{batch}:{i}", "success": True} for i in range(n)])


def _task(engine: Engine, seeded: SeededPromotion) -> str:
    with engine.begin() as conn:
        return str(conn.execute(text("SELECT id FROM task WHERE environment_version_id = :v "
                                     "LIMIT 1"), {"v": seeded.env_version_id}).scalar_one())


@pytest.fixture
def free_slots(owner_engine: Engine) -> Iterator[None]:
    """Routing is one table for the whole database: give the slots back after each test."""
    yield
    _hold(owner_engine, "shadow", None)
    _hold(owner_engine, "canary", None)


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.usefixtures("free_slots")
async def test_an_open_shadow_gate_counts_its_paired_episodes_in_api_and_console(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = _at_gate(owner_engine, people, "shadow", {"shadow": {"min_samples": 12}})
    task_id = _task(owner_engine, seeded)
    _pairs(owner_engine, seeded, task_id, 2)  # before the gate took its slot: not counted
    _hold(owner_engine, "shadow", seeded)
    _pairs(owner_engine, seeded, task_id, 3)
    _served(owner_engine, seeded.root_id, "production", task_id, 4)  # unpaired: not counted

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
    seeded = _at_gate(owner_engine, people, "canary", {"canary": {"min_samples_per_arm": 4}})
    task_id = _task(owner_engine, seeded)
    _hold(owner_engine, "canary", seeded)
    _served(owner_engine, seeded.checkpoint_id, "canary", task_id, 2)
    _served(owner_engine, seeded.root_id, "production", task_id, 5)

    traffic = (await api.get(f"/api/promotions/{seeded.promotion_id}",
                             headers=people["operator"].headers)).json()["traffic"]
    assert traffic["arms"] == {"canary": 2, "production": 5}
    assert (traffic["counted"], traffic["needed"]) == (2, 4)
    assert traffic["message"].startswith("waiting for production traffic: 2 of 4 episodes")

    _served(owner_engine, seeded.checkpoint_id, "canary", task_id, 3)
    traffic = (await api.get(f"/api/promotions/{seeded.promotion_id}",
                             headers=people["operator"].headers)).json()["traffic"]
    assert (traffic["counted"], traffic["enough"]) == (5, True)
    assert traffic["message"].startswith("production traffic is enough: 5 of 4")


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.usefixtures("free_slots")
async def test_a_gate_waiting_for_its_slot_counts_nothing_and_other_gates_have_no_count(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    holder = _at_gate(owner_engine, people, "shadow", {"shadow": {"min_samples": 12}})
    waiting = _at_gate(owner_engine, people, "shadow", {"shadow": {"min_samples": 12}})
    _hold(owner_engine, "shadow", holder)
    _pairs(owner_engine, waiting, _task(owner_engine, waiting), 3)  # its own, yet no slot

    traffic = (await api.get(f"/api/promotions/{waiting.promotion_id}",
                             headers=people["operator"].headers)).json()["traffic"]
    assert traffic["slot_held"] is False and traffic["counted"] == 0
    assert traffic["slot_holder"] == holder.promotion_id
    assert f"held by promotion {holder.promotion_id}" in traffic["message"]

    at_approval = make_promotion(owner_engine, submitted_by=people["engineer"].name)
    body = (await api.get(f"/api/promotions/{at_approval.promotion_id}",
                          headers=people["operator"].headers)).json()
    assert body["traffic"] is None
