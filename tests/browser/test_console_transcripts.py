"""The auditor reads the sampled transcripts on a promotion page, then signs; the access log
holds the reads and the decision names them. An engineer follows a ``NoTrainableData``
failure from the run page to its episodes. Screenshots at 1440 px and 390 px go to /tmp.
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect
from sqlalchemy import Engine, text

from tests.browser.support import Loop, sign_in, start_stand_in
from tests.factories import uid
from tests.factories_transcripts import add_batch, add_episode, promotion_with_episodes
from tests.factories_web import Person
from triloop.config import Settings

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_web_fixtures"]


def _shots(browser: Browser, base_url: str, person: Person, path: str, name: str) -> None:
    """The page at 1440 px and 390 px; the narrow one must not scroll sideways."""
    for width in (1440, 390):
        context = browser.new_context(viewport={"width": width, "height": 900})
        page = context.new_page()
        sign_in(page, base_url, person, target=path)
        page.goto(f"{base_url}{path}")
        page.screenshot(path=f"/tmp/transcripts-{name}-{width}.png", full_page=True)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{path} overflows by {overflow}px at {width}px"
        context.close()


def test_the_auditor_reads_the_sampled_transcripts_then_signs(
    page: Page, browser: Browser, base_url: str, people: dict[str, Person],
    owner_engine: Engine, governance: tuple[Loop, Any], browser_settings: Settings,
) -> None:
    made = promotion_with_episodes(owner_engine, submitted_by=people["engineer"].name)
    seeded = made.seeded
    start_stand_in(governance, browser_settings, seeded)
    auditor = people["auditor"]
    sign_in(page, base_url, auditor, target=f"/promotions/{seeded.promotion_id}")
    page.goto(f"{base_url}/promotions/{seeded.promotion_id}")
    section = page.get_by_test_id("transcripts")
    expect(section.get_by_role("heading", name="Transcripts")).to_be_visible()
    links = section.get_by_test_id("transcript-link")
    expect(links).to_have_count(7)  # 2 tasks x 2 arms x success/failure, less one missing
    opened = []
    for index in (0, 1):  # the candidate's success and failure on the first task
        link = section.get_by_test_id("transcript-link").nth(index)
        opened.append(link.get_attribute("data-trajectory"))
        link.click()
        expect(page.get_by_test_id("turn")).to_have_count(2)
        expect(page.get_by_role("heading", name="Verifier's verdict")).to_be_visible()
        expect(page.get_by_text("move right (1)")).to_be_visible()
        page.get_by_text("Tokens: 4, 2 trained").first.click()
        expect(page.locator(".tok-trained").first).to_be_visible()
        page.get_by_role("link", name="back to the promotion").click()
        section = page.get_by_test_id("transcripts")
    page.get_by_label("Audit comment").fill("read a success and a failure of the candidate")
    page.get_by_role("button", name="Sign audit").click()
    expect(page.get_by_text(f"Audit signed as {auditor.name}")).to_be_visible()
    with owner_engine.connect() as conn:
        reads = conn.execute(text(
            "SELECT DISTINCT resource->>'id' FROM access_event WHERE actor->>'user' = :u"
            " AND resource->>'kind' = 'trajectory' AND resource ? 'id'"),
            {"u": auditor.name}).scalars().all()
        details = conn.execute(text(
            "SELECT details FROM human_decision WHERE subject = :p AND kind = 'audit'"),
            {"p": seeded.promotion_id}).scalar_one()
    assert set(opened) <= set(reads)
    assert details["shown_transcripts"] == opened
    assert set(opened) <= set(details["sampled_transcripts"])
    _shots(browser, base_url, auditor, f"/promotions/{seeded.promotion_id}", "promotion")
    _shots(browser, base_url, auditor, f"/trajectories/{opened[0]}", "trajectory")


def test_a_long_episode_pages_its_turns(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine,
) -> None:
    made = promotion_with_episodes(owner_engine, submitted_by=people["engineer"].name,
                                   with_gate=False)
    traffic = uid("traffic-")
    add_batch(owner_engine, traffic, "production", {f"{traffic}:0": made.tasks[0]})
    long_one = f"{traffic}:0:shadow"
    add_episode(owner_engine, episode_id=long_one, batch_id=traffic, task_id=made.tasks[0],
                checkpoint_id=made.seeded.checkpoint_id, purpose="shadow", success=False,
                turns=13)
    sign_in(page, base_url, people["operator"], target=f"/trajectories/{long_one}")
    page.goto(f"{base_url}/trajectories/{long_one}")
    expect(page.get_by_test_id("turn")).to_have_count(10)
    page.get_by_test_id("more-turns").click()
    expect(page.get_by_test_id("turn")).to_have_count(3)
    expect(page.get_by_role("heading", name="Turn 13 of 13")).to_be_visible()


def test_an_engineer_finds_the_episodes_behind_a_no_trainable_data_failure(
    page: Page, browser: Browser, base_url: str, people: dict[str, Person],
    owner_engine: Engine,
) -> None:
    made = promotion_with_episodes(owner_engine, submitted_by=people["engineer"].name)
    run_id = made.seeded.run_id
    with owner_engine.begin() as conn:
        conn.execute(text(
            "UPDATE training_run SET status = 'failed', status_reason = :r WHERE id = :i"),
            {"i": run_id, "r": "update failed: NoTrainableData: iteration 3 has no finished "
                               "trajectory to learn from (2 failed or never started, 0 truncated)"})
    engineer = people["engineer"]
    sign_in(page, base_url, engineer, target=f"/runs/{run_id}")
    page.goto(f"{base_url}/runs/{run_id}")
    page.get_by_test_id("no-trainable-data").get_by_role(
        "link", name="See the episodes behind it").click()
    expect(page.get_by_role("heading", name="iteration 3")).to_be_visible()
    expect(page.get_by_test_id("episode-link")).to_have_count(2)
    expect(page.get_by_text("the model server went away").first).to_be_visible()
    page.get_by_test_id("episode-link").first.click()
    expect(page.get_by_text("the model server went away")).to_be_visible()
    _shots(browser, base_url, engineer, f"/trajectories?run_id={run_id}&iteration=3",
           "episodes")
    # Another engineer is refused, and told why.
    other = browser.new_context()
    intruder = other.new_page()
    sign_in(intruder, base_url, people["engineer2"], target="/")
    response = intruder.goto(f"{base_url}/trajectories/{made.training[0]}")
    assert response is not None and response.status == 403
    expect(intruder.get_by_text("submitted the run").first).to_be_visible()
    other.close()
