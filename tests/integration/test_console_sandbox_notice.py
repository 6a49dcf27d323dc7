"""The console says where agent code runs: isolated, or unisolated by the development setting."""

from __future__ import annotations

import httpx
import pytest

from triloop.config import Settings

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


@pytest.mark.parametrize(("setting", "notice", "warned"), [
    ("bubblewrap", "Sandbox: agent code isolated by bubblewrap", False),
    ("local", "Sandbox: agent code unisolated (development)", True),
])
async def test_console_footer_names_the_sandbox_setting(
    web_settings: Settings, setting: str, notice: str, warned: bool
) -> None:
    from web.app import create_app

    app = create_app(web_settings.model_copy(update={"sandbox": setting}))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        page = await client.get("/login")
    assert page.status_code == 200
    assert notice in page.text
    assert ('class="warning" id="sandbox-setting"' in page.text) is warned
