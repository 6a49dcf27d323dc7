"""Fixtures the integration modules share (a module never imports another test module)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from tests.factories_governance import Scene, make_scene
from tests.gateway_sdk_support import Served, served_gateway
from triloop.config import Settings


@pytest.fixture
def scene(settings: Settings, owner_engine: Engine, role_engine: Any,
          verifier_service: None) -> Scene:
    """A promotion under judgement by the real evidence activities (PostgreSQL and OPA),
    with the verifier running beside them."""
    del verifier_service
    return make_scene(settings, owner_engine, role_engine)


@pytest.fixture
def served() -> Iterator[Served]:
    """The model gateway on a loopback port with one session and a scripted policy
    (the SDK conformance tests)."""
    with served_gateway() as gateway:
        yield gateway
