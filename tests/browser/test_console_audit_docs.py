"""What an auditor reads, in Chromium: /docs draws the OpenAPI 3.1 document, the audit log
shows one row per act, and the lineage, history and promotion pages fit their screens.

Screenshots at 1440 px and at 390 px go to ``test-output/screenshots/``.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, ViewportSize, expect

from tests.browser.support import shot

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_web_fixtures"]

DESKTOP: ViewportSize = {"width": 1440, "height": 900}
PHONE: ViewportSize = {"width": 390, "height": 844}


def body_overflow(page: Page) -> int:
    """How many CSS pixels the page is wider than the viewport (0 when nothing overflows)."""
    return int(page.evaluate(
        "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
        " - document.documentElement.clientWidth"))


def test_docs_render_the_openapi_3_1_document(page: Page, base_url: str) -> None:
    failed: list[str] = []
    page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
    for size, suffix in ((DESKTOP, "1440"), (PHONE, "390")):
        page.set_viewport_size(size)
        page.goto(f"{base_url}/docs")
        # Swagger UI 4 read the 3.1 document as "Unable to render this definition".
        expect(page.locator(".swagger-ui .info .title")).to_contain_text("triloop")
        expect(page.locator(".swagger-ui .info .version-stamp")).to_contain_text("OAS 3.1")
        audit = page.locator("#operations-tag-audit")
        expect(audit).to_be_visible()
        expect(page.get_by_text("Unable to render this definition")).to_have_count(0)
        expect(page.locator(".swagger-ui .errors-wrapper")).to_have_count(0)
        # An operation opens with its parameters, drawn from the document.
        page.locator("#operations-audit-list_audit_events, [id^='operations-audit-']").first \
            .locator(".opblock-summary").first.click()
        expect(page.locator(".opblock.is-open .parameters").first).to_be_visible()
        shot(page, f"docs-{suffix}")
    assert failed == [], failed
