"""Fixtures for training-run tests: ``pytest_plugins = ["tests.factories_learning_fixtures"]``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client

from triloop.config import Settings
from triloop.temporal import connect


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[Client]:
    """A Temporal client standing in for the web service, which starts training runs."""
    yield await connect(settings, identity="web-test", service="web", loop="learning")
