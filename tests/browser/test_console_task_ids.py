"""Task ids in Chromium: the environment page shows each task's full id (what a RUN.yaml's
rollout.task_ids takes) and whether it is for training or held out, and the ids wrap rather
than overflow a phone's width. Screenshots at 1440 and 390 px go to
``test-output/screenshots/``."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, ViewportSize, expect
from sqlalchemy import Engine, text

from tests.browser.support import shot, sign_in
from tests.factories import insert, uid
from tests.factories_task_sets import make_task_set
from tests.factories_web import Person

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_web_fixtures"]

DESKTOP: ViewportSize = {"width": 1440, "height": 900}
PHONE: ViewportSize = {"width": 390, "height": 844}


def test_the_environment_page_shows_full_task_ids_and_which_are_held_out(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine
) -> None:
    tasks = make_task_set(owner_engine, splits=("train", "eval", "train"), status="admitted",
                          task_status="admitted")
    frozen = uid("maps-")
    insert(owner_engine, "eval_set", id=frozen, name=frozen, version=1, created_by="gov")
    insert(owner_engine, "eval_item", eval_set_id=frozen, ordinal=0,
           task_id=tasks.split("eval")[0])
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE eval_set SET frozen_at = now(), content_hash = 'h'"
                          " WHERE id = :i"), {"i": frozen})
        environment = conn.execute(text(
            "SELECT environment_name FROM environment_version WHERE id = :v"),
            {"v": tasks.environment_version_id}).scalar_one()
    page.set_viewport_size(DESKTOP)
    sign_in(page, base_url, people["engineer"], f"/environments/{environment}")
    for task_id in tasks.task_ids:
        expect(page.locator(f'code.task-id[data-task-id="{task_id}"]')).to_have_text(task_id)
    held = page.locator("details.task", has=page.locator(
        f'code[data-task-id="{tasks.split("eval")[0]}"]'))
    expect(held.locator(".badge-held-out")).to_have_text(f"held out: {frozen}@v1")
    trained = page.locator("details.task", has=page.locator(
        f'code[data-task-id="{tasks.split("train")[0]}"]'))
    expect(trained.get_by_text("training", exact=True)).to_be_visible()
    shot(page, "environment-task-ids")
    page.set_viewport_size(PHONE)
    expect(page.locator(f'code[data-task-id="{tasks.task_ids[0]}"]')).to_be_visible()
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page is {overflow} px wider than the phone"
    shot(page, "environment-task-ids-phone")
