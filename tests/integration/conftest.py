"""Fixtures the integration modules share (a module never imports another test module)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine

from tests.factories_governance import Scene, make_scene
from triloop.config import Settings


@pytest.fixture
def scene(settings: Settings, owner_engine: Engine, role_engine: Any,
          verifier_service: None) -> Scene:
    """A promotion under judgement by the real evidence activities (PostgreSQL and OPA),
    with the verifier running beside them."""
    del verifier_service
    return make_scene(settings, owner_engine, role_engine)
