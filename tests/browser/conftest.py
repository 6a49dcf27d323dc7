"""Fixtures of the browser tests: the console under uvicorn, a stand-in governance
worker, Chromium and a fresh page (desktop size) per test."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from playwright.sync_api import Browser, Page, sync_playwright
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.browser.support import CHROMIUM, CHROMIUM_ARGS, Loop, StandInPromotion, StandInRollback
from triloop.config import Settings
from triloop.devstack.processes import free_port
from triloop.temporal import connect
from triloop.workflow_api import (
    GOVERNANCE_QUEUE,
)


@pytest.fixture(scope="module")
def browser_settings(web_settings: Settings) -> Settings:
    return web_settings.model_copy(update={"task_queue_prefix": f"br-{uuid.uuid4().hex[:8]}-"})


@pytest.fixture(scope="module")
def governance(browser_settings: Settings) -> Iterator[tuple[Loop, Any]]:
    """A stand-in governance worker; yields the loop and a connected client."""
    loop = Loop()
    client = loop.run(connect(browser_settings, identity="test-browser-governance",
                              service="governance"))
    worker = Worker(client, task_queue=browser_settings.task_queue(GOVERNANCE_QUEUE),
                    workflows=[StandInPromotion, StandInRollback],
                    workflow_runner=UnsandboxedWorkflowRunner())
    running = asyncio.run_coroutine_threadsafe(worker.run(), loop.loop)
    yield loop, client
    loop.run(worker.shutdown())
    running.result(10)
    loop.stop()


@pytest.fixture(scope="module")
def base_url(browser_settings: Settings) -> Iterator[str]:
    """The console served by uvicorn in a thread."""
    from web.app import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(browser_settings, temporal_timeout_s=20),
                                           host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the console did not start within 30 s")
        time.sleep(0.2)
    yield url
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail("Debian's Chromium is missing: apt-get install -y chromium "
                    "(make test installs it when run as root)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                              args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    opened = context.new_page()
    yield opened
    context.close()

