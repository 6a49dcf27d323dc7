"""Hostile bodies cannot freeze the web service (issue 19): each is refused, and an
ordinary request sent while one is being handled is answered first.

The bodies are the ones the attack used: a 524-byte YAML alias bomb, a 10 MB task
list and a 10 MB run name. Nothing here measures time. Run-config validation is
held at a gate (a wrapper around the real function) until the ordinary request has
been answered: if validation ran on the event loop, the gate would hold the loop
and the ordinary request could not be answered first. Timeouts are hang guards only.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI

from tests.factories_web import Person, admitted_task, assert_problem
from triloop.config import Settings
from web import actions

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]

HANG_GUARD_S = 120.0
LAUGHS = "\n".join(
    [f"a: &a [{', '.join(['lol'] * 9)}]"]
    + [f"{n}: &{n} [{', '.join(['*' + p] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi",
                                                                 strict=True)]
)
ALIAS_BOMB = f"{LAUGHS}\nname: laughs\nmodel: {{base: tiny}}\nrollout: {{task_ids: *i}}\n"
ALIAS_BOMB += "#" * (524 - len(ALIAS_BOMB) - 1) + "\n"  # the attack's size: 524 bytes
TEN_MB = 10 * 2**20


def hostile_bodies(task_id: str) -> dict[str, dict[str, Any]]:
    """The three bodies of the attack, as ``POST /api/runs`` JSON."""
    many_tasks = [task_id] * (TEN_MB // (len(task_id) + 3))
    return {
        "alias bomb": {"config_yaml": ALIAS_BOMB},
        "10 MB task list": {"config": {"name": "many", "model": {"base": "tiny"},
                                       "rollout": {"task_ids": many_tasks}}},
        "10 MB run name": {"config": {"name": "n" * TEN_MB, "model": {"base": "tiny"},
                                      "rollout": {"task_ids": [task_id]}}},
    }


class ValidationGate:
    """Wraps the real validation: counts calls and holds each until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0
        self.threads: list[str] = []

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def gated(**kwargs: Any) -> Any:
            self.calls += 1
            self.threads.append(threading.current_thread().name)
            self.entered.set()
            self.release.wait(HANG_GUARD_S)
            return real(**kwargs)

        return gated


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[ValidationGate]:
    held = ValidationGate()
    monkeypatch.setattr(actions, "validate_run_config", held.wrap(actions.validate_run_config))
    yield held
    held.release.set()
    held.entered.set()


@pytest_asyncio.fixture(loop_scope="session")
async def roomy_api(web_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The app with room for 10 MB bodies, so that they reach validation."""
    from web.app import create_app

    roomy = create_app(web_settings.model_copy(update={"max_body_bytes": 4 * TEN_MB}))
    transport = httpx.ASGITransport(app=roomy)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


async def answered_in_order(
    hostile: Awaitable[httpx.Response], ordinary: Callable[[], Awaitable[httpx.Response]],
    gate: ValidationGate,
) -> tuple[list[str], httpx.Response, httpx.Response]:
    """Send the hostile request; once it is in validation, send the ordinary one."""
    order: list[str] = []

    async def track(name: str, request: Awaitable[httpx.Response]) -> httpx.Response:
        response = await request
        order.append(name)
        return response

    hostile_task = asyncio.create_task(track("hostile", hostile))
    entered = asyncio.create_task(asyncio.to_thread(gate.entered.wait, HANG_GUARD_S))
    await asyncio.wait({hostile_task, entered}, return_when=asyncio.FIRST_COMPLETED)
    assert gate.entered.is_set(), "the hostile request never reached validation"
    ordinary_response = await track("ordinary", ordinary())
    gate.release.set()
    hostile_response = await asyncio.wait_for(hostile_task, HANG_GUARD_S)
    await entered
    return order, hostile_response, ordinary_response


@pytest.mark.parametrize("which", ["alias bomb", "10 MB task list", "10 MB run name"])
async def test_validation_of_a_hostile_body_never_holds_the_event_loop(
    roomy_api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Any,
    gate: ValidationGate, which: str,
) -> None:
    body = hostile_bodies(admitted_task(owner_engine))[which]
    order, hostile, ordinary = await answered_in_order(
        roomy_api.post("/api/runs", json=body, headers=people["engineer"].headers),
        lambda: roomy_api.get("/api/me", headers=people["auditor"].headers),
        gate,
    )
    assert order == ["ordinary", "hostile"]
    assert ordinary.status_code == 200
    assert gate.threads == [gate.threads[0]] and gate.threads[0].startswith("validation")
    needle = {"alias bomb": "aliases are not accepted", "10 MB task list": "at most 10000 items",
              "10 MB run name": "at most 200 characters"}[which]
    assert_problem(hostile, 422, needle)
    assert len(hostile.content) < 10_000  # the error does not echo the input back


async def test_hostile_bodies_are_refused_with_the_default_limits(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Any, gate: ValidationGate,
) -> None:
    gate.release.set()  # nothing is held here: this is about what each body gets
    engineer = people["engineer"].headers
    bodies = hostile_bodies(admitted_task(owner_engine))
    responses = await asyncio.gather(
        *(api.post("/api/runs", json=body, headers=engineer) for body in bodies.values()),
        api.get("/api/me", headers=people["auditor"].headers),
    )
    bomb, tasks, name, ordinary = responses
    assert ordinary.status_code == 200
    assert_problem(bomb, 422, "aliases are not accepted", "line")
    for refused in (tasks, name):
        assert_problem(refused, 413, "TRILOOP_MAX_BODY_BYTES")
    assert gate.calls == 1  # only the bomb was small enough to be read and validated


async def test_a_chunked_body_over_the_limit_is_refused(
    api: httpx.AsyncClient, people: dict[str, Person], web_app: FastAPI
) -> None:
    limit = web_app.state.services.settings.max_body_bytes
    chunk = json.dumps({"config_yaml": "x"}).encode()[:-2] + b" " * 65536

    async def stream() -> AsyncIterator[bytes]:
        for _ in range(limit // len(chunk) + 2):
            yield chunk

    response = await api.post("/api/runs", content=stream(), headers={
        **people["engineer"].headers, "content-type": "application/json"})
    assert_problem(response, 413, f"at most {limit} bytes")
