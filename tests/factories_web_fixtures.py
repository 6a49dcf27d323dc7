"""Fixtures of the web tests: the app under test, an in-process client, one person per role.

A pytest plugin: web test modules list it in ``pytest_plugins``; helpers they
call directly are in ``tests/factories_web.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from sqlalchemy import Engine

from tests.factories_web import Person, make_user
from triloop.config import Settings


@pytest.fixture(scope="session")
def web_settings(settings: Settings) -> Settings:
    """The test services, with task queues of the web tests' own."""
    return settings.model_copy(update={"task_queue_prefix": f"web-{uuid.uuid4().hex[:8]}-"})


@pytest.fixture(scope="session")
def web_app(web_settings: Settings) -> FastAPI:
    """The app under test (short Temporal timeout: stand-ins answer at once)."""
    from web.app import create_app

    return create_app(web_settings, temporal_timeout_s=15.0)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def api(web_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client talking to the app in-process."""
    transport = httpx.ASGITransport(app=web_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


@pytest.fixture(scope="session")
def people(owner_engine: Engine) -> dict[str, Person]:
    """One person per role (and a second operator and auditor for duty checks)."""
    return {
        "engineer": make_user(owner_engine, "ml_engineer"),
        "engineer2": make_user(owner_engine, "ml_engineer"),
        "operator": make_user(owner_engine, "operator"),
        "operator2": make_user(owner_engine, "operator"),
        "auditor": make_user(owner_engine, "auditor"),
        "auditor_operator": make_user(owner_engine, "auditor", "operator"),
        "admin": make_user(owner_engine, "admin"),
    }


@pytest.fixture(scope="module")
def faults_app(web_settings: Settings, home: Path) -> FastAPI:
    """The web app over the requesting module's own ``home``: a faults file no other test's
    workers read (each faults module defines ``home``)."""
    from web.app import create_app

    own = web_settings.model_copy(update={"home": home, "secrets_dir": web_settings.secrets})
    return create_app(own, temporal_timeout_s=5.0)
