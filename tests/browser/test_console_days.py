"""Each role through its day in Chromium, and every page at a phone's width (390 px).

The operator opens the console, sees what serves production and what waits for them
(with the count in the nav), reads a gate's analysis (verdict, checks, raw JSON behind a
toggle) and rolls back after reading the preview. The ML engineer watches a run: charts
of every metric with hover values, smoothing and a second run overlaid. Screenshots at
desktop width and at 390 px go to ``test-output/screenshots/``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect
from sqlalchemy import Engine, text

from governance_loop.gates.shadow import ShadowSample, decide_shadow
from governance_loop.gates.thresholds import ThresholdSpec
from tests.browser.support import Loop, seeded_for_approval, shot, sign_in
from tests.factories import insert, make_run, uid
from tests.factories_web import (
    Person,
    add_gate,
    add_steps,
    ensure_production,
    make_promotion,
    make_user,
)

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_web_fixtures"]

PHONE = {"width": 390, "height": 844}


def body_overflow(page: Page) -> int:
    """How many CSS pixels the page is wider than the viewport (0 when nothing overflows)."""
    return int(page.evaluate(
        "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
        " - document.documentElement.clientWidth"))


def alias_history(engine: Engine, people: dict[str, Person]) -> tuple[str, Any]:
    """An alias whose candidate was rolled back by the watch: a plain rollback must skip it."""
    seeded = make_promotion(engine, submitted_by=people["engineer"].name,
                            status="rolled_back", current_gate="watch")
    alias = uid("day-").lower()
    base, good, bad = seeded.root_id, seeded.parent_id, seeded.checkpoint_id
    insert(engine, "deployment", alias=alias, checkpoint_id=good, updated_by="governance")
    for kind, checkpoint, previous in (("bootstrap", base, None), ("promote", good, base),
                                       ("promote", bad, good), ("rollback", good, bad)):
        insert(engine, "deployment_history", alias=alias, checkpoint_id=checkpoint,
               previous_checkpoint_id=previous, kind=kind, actor="governance",
               reason=f"{kind} for the operator's day")
    return alias, seeded


def test_operator_day_production_pending_evidence_and_rollback_with_preview(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine,
    governance: tuple[Loop, Any],
) -> None:
    waiting = seeded_for_approval(owner_engine, people)
    starved = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                             status="failed", current_gate="shadow")
    spec = ThresholdSpec.from_mapping({"version": "t-day", "min_success_rate": 0.6,
                                       "max_regression_vs_production": 0.05,
                                       "min_samples": 50, "shadow": {"min_samples": 12}})
    decision = decide_shadow([ShadowSample(f"e{i}", 3, 3, 1.0, 1.0) for i in range(3)], spec)
    add_gate(owner_engine, starved.promotion_id, "shadow", passed=False,
             evidence=decision.evidence)
    alias, rolled_back = alias_history(owner_engine, people)
    serving, _ = ensure_production(owner_engine, people)
    operator = people["operator"]

    sign_in(page, base_url, operator)
    production = page.get_by_role("region", name="Production now")
    expect(production).to_contain_text(serving[:16])
    expect(page.get_by_test_id("pending-count")).to_be_visible()
    waiting_list = page.get_by_role("region", name="Waiting for you")
    expect(waiting_list.locator(f"a[href='/promotions/{waiting.promotion_id}']")).to_be_visible()
    expect(page.get_by_role("heading", name="Recent alarms")).to_have_count(0)
    shot(page, "day-operator-home")

    page.goto(f"{base_url}/promotions/{starved.promotion_id}")
    verdict = page.get_by_test_id("verdict-shadow")
    expect(verdict).to_contain_text("did not see enough production traffic: 3, needs 12")
    checks = page.locator("table.checks").first
    expect(checks.get_by_role("row", name="Paired production episodes")).to_contain_text(
        "pending")
    raw = page.get_by_text("Raw evidence (JSON)").first
    expect(page.locator("pre.code").first).not_to_be_visible()
    raw.click()
    expect(page.locator("pre.code").first).to_contain_text('"paired_episodes": 3')
    shot(page, "day-gate-evidence")

    page.set_viewport_size(PHONE)  # the on-call operator rolls back from a phone
    page.goto(f"{base_url}/deployments")
    history = page.get_by_role("region", name=f"History of {alias}")
    expect(history.get_by_role("row")).to_have_count(5)
    expect(history.locator(f"a[href='/promotions/{rolled_back.promotion_id}']")).to_be_visible()
    history.get_by_role("link", name=f"Roll back {alias}…").click()  # reachable at 390 px
    expect(page.get_by_test_id("target-status")).to_contain_text("bootstrapped")
    expect(page.get_by_test_id("rollback-warning").first).to_contain_text(
        "passes over revision 3")
    expect(page.locator("a[href*='to_revision=3']")).to_have_count(0)
    assert body_overflow(page) <= 0
    shot(page, "day-rollback-preview-390")
    page.get_by_label("Reason").fill("on-call: error budget burning")
    page.get_by_label("I confirm rolling back").check()
    page.get_by_role("button", name="Roll back now").click()
    expect(page.get_by_role("status")).to_contain_text(f"Rolled back {alias}")
    with owner_engine.connect() as conn:
        details = conn.execute(text(
            "SELECT details FROM human_decision WHERE kind = 'rollback' AND subject = :a"),
            {"a": alias}).scalar_one()
    assert details["to_revision"] == 1  # the previewed target, not the rolled-back candidate


def test_engineer_watches_a_run_with_hover_smoothing_and_an_overlay(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine,
) -> None:
    engineer = people["engineer"]
    run_id = make_run(owner_engine, submitted_by=engineer.name)
    other = make_run(owner_engine, submitted_by=engineer.name)
    for run, scale in ((run_id, 1.0), (other, 0.5)):
        for i in range(8):
            insert(owner_engine, "training_step", run_id=run, iteration=i,
                   reward_mean=0.1 * i * scale, entropy=2.0 - 0.1 * i, kl=0.01 * i,
                   grad_norm=0.5, discrimination=0.8,
                   alarms=["echo_trap"] if i == 5 and run == run_id else [],
                   length_stats={"mean": 10 + i},
                   metrics={"reward/task/sort": 0.1 * i, "reward/task/count": 0.05 * i,
                            "reward/env/lists": 0.07 * i})
    sign_in(page, base_url, engineer, f"/runs/{run_id}")
    charts = page.locator("#charts")
    expect(charts).to_have_attribute("data-alarm-count", "1")
    # The script sets data-drawn once it has drawn every chart: wait for it, then compare.
    expect(charts).to_have_attribute("data-drawn", re.compile(r"^[1-9][0-9]*$"))
    expect(page.locator("figure.chart")).to_have_count(int(charts.get_attribute("data-drawn")
                                                           or 0))
    per_task = page.locator("figure#chart-reward-task")
    expect(per_task.locator("figcaption")).to_have_text("Reward per task (reward)")
    expect(per_task.locator(".u-legend .u-series")).to_have_count(3)  # x + count + sort
    expect(page.locator("figure#chart-length-mean")).to_be_visible()
    # Hover: the legend shows the values at the iteration under the cursor.
    reward = page.locator("figure#chart-reward-mean")
    reward.locator(".u-over").hover()
    expect(reward.locator(".u-legend .u-series").nth(1).locator(".u-value")).not_to_have_text(
        "—")
    # Smoothing redraws with the slider's weight.
    page.locator("#smoothing").fill("0.6")
    expect(page.locator("#smoothing-value")).to_have_text("0.6")
    # A second run overlaid: one more (dashed) series per line.
    page.get_by_label("Overlay run").select_option(other)
    expect(reward.locator(".uplot")).to_have_attribute("data-series", "2")
    shot(page, "day-engineer-run")


def test_every_page_fits_a_phone(
    browser: Browser, base_url: str, people: dict[str, Person], owner_engine: Engine,
) -> None:
    run_id = make_run(owner_engine, submitted_by=people["engineer"].name)
    add_steps(owner_engine, run_id, 6, alarm_at=3)
    seeded = seeded_for_approval(owner_engine, people)
    alias, _ = alias_history(owner_engine, people)
    everyone = make_user(owner_engine, "operator", "auditor", "ml_engineer")
    pages = {
        "home": "/", "runs": "/runs", "run": f"/runs/{run_id}", "promotions": "/promotions",
        "promotion": f"/promotions/{seeded.promotion_id}", "deployments": "/deployments",
        "rollback-confirm": f"/rollback?alias={alias}", "environments": "/environments",
        "audit-log": "/audit", "lineage": f"/checkpoints/{seeded.checkpoint_id}/lineage",
        "not-found": "/promotions/nope",
    }
    for width, suffix in ((1366, "desktop"), (PHONE["width"], "390")):
        context = browser.new_context(viewport={"width": width, "height": 900})
        phone = context.new_page()
        sign_in(phone, base_url, everyone)
        for name, path in pages.items():
            phone.goto(f"{base_url}{path}")
            expect(phone.locator("h1").first).to_be_visible()
            if name == "run":
                # add_steps fills six columns: six charts drawn.
                expect(phone.locator("#charts")).to_have_attribute("data-drawn", "6")
            shot(phone, f"{name}-{suffix}")
            assert body_overflow(phone) <= 0, (name, width, body_overflow(phone), phone.evaluate(
                "[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect()"
                ".right > document.documentElement.clientWidth + 1).slice(0, 5)"
                ".map(e => e.tagName + '.' + e.className + ' ' + (e.textContent || '')"
                ".slice(0, 40))"))
        context.close()
