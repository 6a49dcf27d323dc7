"""The console says whether Temporal checks who calls it (quick mode's dev server does not)."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import Engine

from tests.factories_web import Person, make_promotion
from tests.integration.console_client import console_session
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


@pytest.mark.parametrize(("mode", "ui_url", "link"), [
    ("dev", None, "http://127.0.0.1:8233/namespaces/"),
    ("server", None, None),
    ("server", "https://temporal.example.test/", "https://temporal.example.test/namespaces/"),
])
async def test_run_and_promotion_pages_show_the_workflow_and_link_the_temporal_ui(
    web_settings: Settings, people: dict[str, Person], owner_engine: Engine,
    mode: str, ui_url: str | None, link: str | None,
) -> None:
    from web.app import create_app

    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name)
    settings = web_settings.model_copy(update={
        "temporal_mode": mode, "temporal_ui_url": ui_url,
        "temporal_address": "127.0.0.1:" + web_settings.temporal_address.rsplit(":", 1)[1]})
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        await console_session(client, people["operator"])
        page = (await client.get(f"/promotions/{seeded.promotion_id}")).text
    assert f'data-testid="workflow-id">{seeded.workflow_id}<' in page
    namespace = settings.temporal_namespace("governance")
    if link is None:
        assert 'data-testid="temporal-ui-link"' not in page
        assert "no Temporal UI is configured" in page
    else:
        assert f'href="{link}{namespace}/workflows/{seeded.workflow_id}"' in page
