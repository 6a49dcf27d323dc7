"""The console says whether Temporal checks who calls it (quick mode's dev server does not)."""

from __future__ import annotations

import httpx
import pytest

from triloop.config import Settings

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


@pytest.mark.parametrize(("mode", "notice"), [
    ("server", "each loop in its own namespace, every call authorized"),
    ("dev", "development server, unauthenticated"),
])
async def test_console_footer_names_the_temporal_mode(
    web_settings: Settings, mode: str, notice: str
) -> None:
    from web.app import create_app

    app = create_app(web_settings.model_copy(update={"temporal_mode": mode}))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        page = await client.get("/login")
    assert page.status_code == 200
    assert notice in page.text
