"""The console's footer says, on every page and at phone width, that agent code runs
unisolated when the stack's development setting says so (``TRILOOP_SANDBOX=local``)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.browser.support import shot
from triloop.config import Settings

pytestmark = pytest.mark.browser
pytest_plugins = ["tests.factories_web_fixtures"]


@pytest.fixture(scope="module")
def browser_settings(browser_settings: Settings) -> Settings:
    """This module's console runs with the development setting."""
    return browser_settings.model_copy(update={"sandbox": "local"})


@pytest.mark.parametrize("width", [1440, 390])
def test_the_footer_warns_that_agent_code_runs_unisolated(
    page: Page, base_url: str, width: int
) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{base_url}/login")
    notice = page.locator("#sandbox-setting")
    expect(notice).to_have_text("Sandbox: agent code unisolated (development)")
    expect(notice).to_have_class("warning")
    expect(notice).to_have_attribute("title", "TRILOOP_SANDBOX=local, a development setting:"
                                     " agent code runs with rlimits only, without bubblewrap,"
                                     " and each episode's record says so.")
    box = notice.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width
    shot(page, f"sandbox-footer-unisolated-{width}")
