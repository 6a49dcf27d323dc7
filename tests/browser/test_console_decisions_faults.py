"""In Chromium at 1440 px and 390 px: the banner every page shows while a serving fault is in
force, and an operator with no decision to make (issue 28, items 1 and 5).

The console here has a stack home of its own (this module's ``browser_settings``), so the
fault it injects is read by no other test's execution workers. Screenshots go to
``test-output/screenshots/``; no page answers a 404, the favicon included.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Response, expect
from sqlalchemy import Engine

from tests.browser.support import shot, sign_in
from tests.factories import make_checkpoint
from tests.factories_web import Person, add_steps, make_promotion, make_user
from triloop.config import Settings
from triloop.faults import read_serving_faults

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_web_fixtures"]

WIDTHS = {"1440": {"width": 1440, "height": 900}, "390": {"width": 390, "height": 844}}


@pytest.fixture(scope="module")
def fault_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("browser-faults-home")


@pytest.fixture(scope="module")
def browser_settings(web_settings: Settings, fault_home: Path) -> Settings:
    """This module's console: its own task queues and its own stack home (faults file)."""
    return web_settings.model_copy(update={
        "task_queue_prefix": f"brf-{uuid.uuid4().hex[:8]}-", "home": fault_home,
        "secrets_dir": web_settings.secrets})


@pytest.fixture
def contexts(browser: Browser) -> Iterator[dict[str, BrowserContext]]:
    """One browser context per width; each page's failed responses are collected."""
    opened = {name: browser.new_context(viewport=size) for name, size in WIDTHS.items()}
    yield opened
    for context in opened.values():
        context.close()


def _watch(page: Page) -> list[str]:
    failed: list[str] = []

    def seen(response: Response) -> None:
        if response.status >= 400:
            failed.append(f"{response.status} {response.url}")

    page.on("response", seen)
    return failed


def _overflow(page: Page) -> int:
    return int(page.evaluate(
        "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
        " - document.documentElement.clientWidth"))


def test_the_faults_banner_shows_on_every_page_at_both_widths(
    contexts: dict[str, BrowserContext], base_url: str, people: dict[str, Person],
    owner_engine: Engine, fault_home: Path,
) -> None:
    checkpoint = make_checkpoint(owner_engine)
    operator = people["operator"]
    desk = contexts["1440"].new_page()
    failed = _watch(desk)
    sign_in(desk, base_url, operator, "/faults")
    expect(desk.get_by_test_id("no-faults")).to_be_visible()
    desk.get_by_label("Checkpoint id").fill(checkpoint)
    desk.get_by_label("Temperature").fill("6")
    desk.get_by_label("Note").fill("game day: does the watch gate notice?")
    desk.get_by_role("button", name="Inject fault").click()
    expect(desk.get_by_role("status")).to_contain_text("Fault injected")
    assert checkpoint in read_serving_faults(fault_home)
    banner = desk.get_by_role("region", name="Serving fault in force")
    expect(banner).to_contain_text("game day: does the watch gate notice?")
    expect(banner).to_contain_text(f"injected by {operator.name}")
    expect(banner).to_contain_text(checkpoint[:16])
    shot(desk, "faults-page-1440")
    for name, path in (("home", "/"), ("deployments", "/deployments"),
                       ("promotions", "/promotions")):
        desk.goto(f"{base_url}{path}")
        expect(desk.get_by_role("region", name="Serving fault in force")).to_contain_text(
            "game day: does the watch gate notice?")
        shot(desk, f"faults-banner-{name}-1440")
    assert not failed, failed

    phone = contexts["390"].new_page()
    failed = _watch(phone)
    sign_in(phone, base_url, people["auditor"])
    banner = phone.get_by_role("region", name="Serving fault in force")
    expect(banner).to_contain_text(f"injected by {operator.name}")
    expect(banner).to_contain_text("since")
    shot(phone, "faults-banner-home-390")
    assert _overflow(phone) <= 0
    phone.get_by_role("link", name="See the faults").click()
    expect(phone.get_by_test_id("faults-table")).to_contain_text(operator.name)
    expect(phone.get_by_role("button", name="Clear every fault")).to_have_count(0)
    expect(phone.get_by_role("button", name="Inject fault")).to_have_count(0)
    shot(phone, "faults-page-390")
    assert not failed, failed

    desk.goto(f"{base_url}/faults")
    desk.get_by_role("button", name="Clear every fault").click()
    expect(desk.get_by_role("status")).to_contain_text("Cleared 1 serving fault")
    expect(desk.get_by_role("region", name="Serving fault in force")).to_have_count(0)
    assert read_serving_faults(fault_home) == {}


def test_an_operator_with_no_decision_to_make_is_told_why_at_both_widths(
    contexts: dict[str, BrowserContext], base_url: str, people: dict[str, Person],
    owner_engine: Engine,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            current_gate="stability")
    add_steps(owner_engine, seeded.run_id, 8, alarm_at=6)
    newcomer = make_user(owner_engine, "operator")  # their role is newer than the promotion
    for width, context in contexts.items():
        page = context.new_page()
        failed = _watch(page)
        sign_in(page, base_url, newcomer, f"/promotions/{seeded.promotion_id}")
        expect(page).to_have_url(f"{base_url}/promotions/{seeded.promotion_id}")
        none = page.get_by_test_id("no-decision")
        expect(none.get_by_role("heading", name="No decision for you here")).to_be_visible()
        expect(none).to_contain_text("a role must predate the promotion it decides on")
        expect(none).to_contain_text(f"{newcomer.name}'s operator role became active")
        expect(page.get_by_role("button", name="Override alarms")).to_have_count(0)
        shot(page, f"no-decision-to-make-{width}")
        assert _overflow(page) <= 0, width
        # Home does not list it as waiting for them (other tests' promotions in the shared
        # database may wait for a rejection, which needs no role age).
        page.goto(f"{base_url}/")
        waiting = page.locator("section[aria-labelledby='waiting-h']")
        expect(waiting).to_be_visible()
        expect(waiting.locator(f"a[href='/promotions/{seeded.promotion_id}']")).to_have_count(0)
        assert not failed, failed
