"""Tags in Chromium: a run's page shows reward and success per tag (a row per tag value,
and the per-tag charts), and an eval set's page shows its coverage per tag. Screenshots
at desktop width and at 390 px go to ``test-output/screenshots/``."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import Page, ViewportSize, expect
from sqlalchemy import Engine, text

from tests.browser.support import shot, sign_in
from tests.factories import insert, make_environment_version, make_run, uid
from tests.factories_web import Person

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_web_fixtures"]

PHONE: ViewportSize = {"width": 390, "height": 844}


def test_the_run_page_shows_reward_and_success_per_tag(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine
) -> None:
    run_id = make_run(owner_engine, submitted_by=people["engineer"].name)
    for iteration, series in (
        (1, {"success/rate": 0.25, "reward/tag/difficulty=easy": 0.4,
             "success/tag/difficulty=easy": 0.5, "reward/tag/domain=grid": 0.4}),
        (2, {"success/rate": 0.5, "reward/tag/difficulty=easy": 0.8,
             "success/tag/difficulty=easy": 0.75, "reward/tag/difficulty=hard": 0.1,
             "success/tag/difficulty=hard": 0.0, "reward/tag/domain=grid": 0.45}),
    ):
        insert(owner_engine, "training_step", run_id=run_id, iteration=iteration,
               reward_mean=0.3 * iteration, alarms=[], length_stats={},
               metrics={"series": series})
    sign_in(page, base_url, people["engineer"], f"/runs/{run_id}")
    expect(page.get_by_role("heading", name="Reward and success per tag")).to_be_visible()
    rows = page.locator("#tag-results tbody tr")
    expect(rows).to_have_count(3)
    easy = page.locator('#tag-results tr[data-tag="difficulty=easy"] td')
    expect(easy).to_have_text(["difficulty", "easy", "0.8", "75%", "2"])
    hard = page.locator('#tag-results tr[data-tag="difficulty=hard"] td')
    expect(hard).to_have_text(["difficulty", "hard", "0.1", "0%", "2"])
    grid = page.locator('#tag-results tr[data-tag="domain=grid"] td')
    expect(grid).to_have_text(["domain", "grid", "0.45", "—", "2"])
    # The series are charted too, one overlaid chart for reward and one for success.
    expect(page.get_by_role("img", name="Reward per tag", exact=False)).to_be_visible()
    expect(page.get_by_role("img", name="Success rate per tag", exact=False)).to_be_visible()
    shot(page, "run-tags")
    page.set_viewport_size(PHONE)
    expect(page.locator("#tag-results")).to_be_visible()
    shot(page, "run-tags-phone")


def test_the_eval_set_page_shows_its_coverage_per_tag(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine
) -> None:
    version = make_environment_version(owner_engine)
    eval_set = uid("es-")
    insert(owner_engine, "eval_set", id=eval_set, name=uid("held-out-"), version=1,
           created_by="gov")
    for ordinal, tags in enumerate(({"difficulty": "easy"}, {"difficulty": "easy"},
                                    {"difficulty": "hard"}, {})):
        task = uid("cov-")
        insert(owner_engine, "task", id=task, environment_version_id=version, seed=ordinal,
               status="admitted", evidence={})
        with owner_engine.begin() as conn:
            conn.execute(text("UPDATE task SET tags = CAST(:t AS jsonb) WHERE id = :i"),
                         {"t": json.dumps(tags), "i": task})
        insert(owner_engine, "eval_item", eval_set_id=eval_set, ordinal=ordinal, task_id=task)
    with owner_engine.begin() as conn:  # frozen once its items are in, as governance does
        conn.execute(text("UPDATE eval_set SET frozen_at = now() WHERE id = :i"), {"i": eval_set})
    sign_in(page, base_url, people["operator"], "/eval-sets")
    page.get_by_role("link", name="Eval sets").first.click()
    page.locator(f'a[href="/eval-sets/{eval_set}"]').click()
    expect(page.get_by_role("heading", name="Coverage per tag")).to_be_visible()
    expect(page.locator('#tag-coverage tr[data-tag="difficulty=easy"] td')).to_have_text(
        ["difficulty", "easy", "2", "50%"])
    expect(page.locator('#tag-coverage tr[data-tag="difficulty=hard"] td')).to_have_text(
        ["difficulty", "hard", "1", "25%"])
    expect(page.get_by_text("1 task carries no tag.")).to_be_visible()
    shot(page, "eval-set-coverage")
