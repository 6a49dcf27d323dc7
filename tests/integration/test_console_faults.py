"""An active serving fault is seen on every console page, and operators inject and clear
faults from the console (issue 28, item 5).

The banner says what is degraded, since when, by whom and the note; who and when come
from the audit log's record of the injection. The faults page lists faults for whoever may
read them, with the forms for operators only; a form with a mistake comes back with the
input and the error beside its field. The app has a stack home of its own, so no other
test's execution workers read this module's faults.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from sqlalchemy import Engine

from tests.factories import make_checkpoint
from tests.factories_web import Person
from tests.integration.console_client import console_session, csrf_of
from triloop.faults import read_serving_faults

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's stack home: the faults file no other test's workers read."""
    return tmp_path_factory.mktemp("console-faults-home")


@pytest_asyncio.fixture(loop_scope="session")
async def console(faults_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=faults_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


async def _inject(console: httpx.AsyncClient, **fields: str) -> httpx.Response:
    form = await console.get("/faults")
    return await console.post("/faults", data={**fields, "csrf_token": csrf_of(form.text)},
                              headers={"accept": "text/html"})


def _banner(page: str) -> str:
    found = re.search(r'<section class="fault-banner".*?</section>', page, re.S)
    return found.group(0) if found else ""


async def test_an_injected_fault_shows_on_every_page_until_an_operator_clears_it(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, home: Path,
) -> None:
    checkpoint = make_checkpoint(owner_engine)
    operator = people["operator"]
    await console_session(console, operator)
    assert _banner((await console.get("/")).text) == ""
    sent = await _inject(console, checkpoint_id=checkpoint, temperature="7.5",
                         note="game day: does the watch gate notice?")
    assert sent.status_code == 303, sent.text
    assert read_serving_faults(home)[checkpoint].temperature == 7.5

    for who in ("operator", "auditor", "engineer"):
        await console_session(console, people[who])
        for path in ("/", "/deployments", "/promotions", "/runs", "/faults"):
            banner = _banner((await console.get(path)).text)
            assert checkpoint[:16] in banner, (who, path)
            assert "game day: does the watch gate notice?" in banner
            assert f"injected by <strong>{operator.name}</strong>" in banner
            assert re.search(r"since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", banner)
            assert "7.5" in banner
    # Who may not read faults (an admin's roles do not) gets no banner.
    await console_session(console, people["admin"])
    assert _banner((await console.get("/")).text) == ""

    listed = await console.get("/api/faults", headers=people["auditor"].headers)
    [fault] = [f for f in listed.json() if f["checkpoint_id"] == checkpoint]
    assert fault["injected_by"] == operator.name and fault["injected_at"]

    # The faults page: forms for operators only.
    await console_session(console, people["auditor"])
    page = (await console.get("/faults")).text
    assert 'data-testid="faults-table"' in page and operator.name in page
    assert 'action="/faults"' not in page and 'action="/faults/clear"' not in page
    await console_session(console, operator)
    page = (await console.get("/faults")).text
    assert 'action="/faults"' in page and 'action="/faults/clear"' in page
    cleared = await console.post("/faults/clear", data={"csrf_token": csrf_of(page)},
                                 headers={"accept": "text/html"})
    assert cleared.status_code == 303, cleared.text
    assert read_serving_faults(home) == {}
    assert _banner((await console.get("/")).text) == ""


async def test_a_fault_form_with_a_mistake_comes_back_with_the_input_and_the_errors(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, home: Path,
) -> None:
    checkpoint = make_checkpoint(owner_engine)
    await console_session(console, people["operator"])
    blank = await _inject(console, checkpoint_id=checkpoint, temperature="hot", note="   ")
    assert blank.status_code == 422, blank.text
    page = blank.text
    assert 'data-testid="note-error"' in page and 'data-testid="temperature-error"' in page
    assert 'data-testid="checkpoint_id-error"' not in page
    assert f'value="{checkpoint}"' in page and 'value="hot"' in page
    unknown = await _inject(console, checkpoint_id="no-such-checkpoint-xyz", temperature="3",
                            note="game day")
    assert unknown.status_code == 422
    assert 'data-testid="checkpoint_id-error"' in unknown.text
    assert "no-such-checkpoint-xyz" in unknown.text and 'value="game day"' not in unknown.text
    assert ">game day</textarea>" in unknown.text
    assert read_serving_faults(home) == {}
    # Someone the policy does not let inject is refused (403), whatever the form said.
    await console_session(console, people["auditor"])
    forged = await _inject(console, checkpoint_id=checkpoint, temperature="3", note="x")
    assert forged.status_code == 403
    assert read_serving_faults(home) == {}
