"""Deployment history in the console and a rollback preview that never offers a rolled-back
candidate: it warns when it passes over one, and refuses when nothing earlier is eligible."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from sqlalchemy import Engine

from tests.factories import insert, uid
from tests.factories_web import Person, make_promotion
from tests.integration.console_client import console_session

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


@pytest_asyncio.fixture(loop_scope="session")
async def console(web_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=web_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


def alias_with_history(engine: Engine, moves: list[tuple[str, str, str | None]],
                       serving: str) -> str:
    """An alias whose history is ``(kind, checkpoint, previous)`` moves, oldest first."""
    alias = uid("alias-").lower()
    insert(engine, "deployment", alias=alias, checkpoint_id=serving, updated_by="governance")
    for kind, checkpoint, previous in moves:
        insert(engine, "deployment_history", alias=alias, checkpoint_id=checkpoint,
               previous_checkpoint_id=previous, kind=kind, actor="governance",
               reason=f"{kind} {checkpoint[:12]} for the test")
    return alias


@pytest.mark.asyncio(loop_scope="session")
async def test_preview_passes_over_a_rolled_back_candidate_and_says_so(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            status="rolled_back", current_gate="watch")
    base, good, bad = seeded.root_id, seeded.parent_id, seeded.checkpoint_id
    alias = alias_with_history(owner_engine, [
        ("bootstrap", base, None), ("promote", good, base), ("promote", bad, good),
        ("rollback", good, bad)], serving=good)
    await console_session(console, people["operator"])

    listing = (await console.get("/deployments")).text
    history = listing.split(f'id="history-{alias}"', 1)[1].split("</section>", 1)[0]
    assert history.count("<tr") == 5  # header + 4 revisions
    assert f'href="/promotions/{seeded.promotion_id}"' in history  # the bad one's promotion
    assert "rolled back</span>" in history and "by revision 4" in history
    assert f'href="/rollback?alias={alias}"' in listing

    preview = (await console.get(f"/rollback?alias={alias}")).text
    assert "revision 1:" in preview and base[:24] in preview
    assert "bootstrapped (no promotion)" in preview
    warning = preview.split('data-testid="rollback-warning"', 1)[1]
    assert "passes over revision 3" in warning and "rolled back by revision 4" in warning
    assert "Roll back now" in preview
    # The rolled-back candidate is never offered as a target from the history either.
    assert "to_revision=3" not in preview

    # The API's preview (and so `triloop rollback --dry-run`) carries the same warnings.
    api = await console.get(f"/api/deployments/{alias}/rollback-preview",
                            headers=people["operator"].headers)
    assert api.status_code == 200, api.text
    body = api.json()
    assert body["target"]["revision"] == 1 and body["skipped"] == [2, 3, 4]
    assert any("passes over revision 3" in w for w in body["warnings"])
    assert [r["promotion_id"] for r in body["history"] if r["revision"] == 3] == [
        seeded.promotion_id]

    named = await console.get(f"/rollback?alias={alias}&to_revision=3")
    assert named.status_code == 200
    assert "Refused." in named.text and "Roll back now" not in named.text


@pytest.mark.asyncio(loop_scope="session")
async def test_nothing_eligible_means_no_rollback_button_and_a_refusal(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            status="rolled_back", current_gate="watch")
    base, bad = seeded.parent_id, seeded.checkpoint_id
    alias = alias_with_history(owner_engine, [
        ("bootstrap", base, None), ("promote", bad, base), ("rollback", base, bad)],
        serving=base)
    await console_session(console, people["operator"])
    listing = (await console.get("/deployments")).text
    assert f'href="/rollback?alias={alias}"' not in listing
    row = listing.split(f'href="#history-{alias}"', 1)[1].split("</tr>", 1)[0]
    assert "no eligible revision" in row
    preview = (await console.get(f"/rollback?alias={alias}")).text
    assert "Refused." in preview and "Roll back now" not in preview
