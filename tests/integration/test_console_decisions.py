"""The console offers a person only the decisions governance will accept, says why it offers
none, brings a blank comment's form back, and says an error once (issue 28, item 1).

A role must predate the promotion it decides on: governance refuses an approval, an audit
signature or an alarm override by a role that became active after the promotion opened.
The web service now asks the policy the same question (``role_age.rego``), so the page
withholds the form with the policy's reason and the API refuses before Temporal.
"""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from sqlalchemy import Engine, text

from tests.factories import insert, uid
from tests.factories_web import Person, add_approval, assert_problem, make_promotion, make_user
from tests.integration.console_client import console_session, csrf_of

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]
RULE = "a role must predate the promotion it decides on"


@pytest_asyncio.fixture(loop_scope="session")
async def console(web_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A browser-like client of its own (its own cookie jar)."""
    transport = httpx.ASGITransport(app=web_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


def _decisions_written(engine: Engine, promotion_id: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM human_decision WHERE subject = :s"),
                                {"s": promotion_id}).scalar_one())


def _grant_now(engine: Engine, user: str, role: str) -> None:
    """``role`` confirmed for ``user`` just now, as a second admin's confirmation records it."""
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO role_grant (id, user_name, role, requested_by, requested_at,"
            " confirmed_by, confirmed_at, status) VALUES (:i, :u, :r, :a, now(), :b, now(),"
            " 'active')"), {"i": uid("grant-"), "u": user, "r": role, "a": uid("adm-a-"),
                            "b": uid("adm-b-")})
        conn.execute(text("UPDATE app_user SET roles = array_append(roles, :r) WHERE name = :u"
                          " AND NOT (:r = ANY(roles))"), {"r": role, "u": user})


async def test_an_operator_whose_role_is_newer_than_the_promotion_gets_no_override_form(
    console: httpx.AsyncClient, api: httpx.AsyncClient, people: dict[str, Person],
    owner_engine: Engine,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            current_gate="stability")
    newcomer = make_user(owner_engine, "operator")  # created, so operator, after it opened
    await console_session(console, newcomer)
    page = (await console.get(f"/promotions/{seeded.promotion_id}")).text
    assert f'action="/promotions/{seeded.promotion_id}/override-alarms"' not in page
    assert 'data-testid="no-decision"' in page and RULE in page
    assert f"{newcomer.name}'s operator role became active" in html.unescape(page)
    # Nor does Home list it as waiting for them (the nav's count is over the whole shared
    # database, where other tests' promotions may wait for a rejection: no role age needed).
    home = (await console.get("/")).text
    waiting = home.split('id="waiting-h"', 1)[1].split("</section>", 1)[0]
    assert f"/promotions/{seeded.promotion_id}" not in waiting

    # An operator whose role predates the promotion gets the form.
    await console_session(console, people["operator"])
    page = (await console.get(f"/promotions/{seeded.promotion_id}")).text
    assert f'action="/promotions/{seeded.promotion_id}/override-alarms"' in page
    assert 'data-testid="no-decision"' not in page

    # The API refuses it too, before anything reaches Temporal or the decision table.
    refused = await api.post(f"/api/promotions/{seeded.promotion_id}/override-alarms",
                             json={"comment": "the alarms are an artefact"},
                             headers=newcomer.headers)
    assert_problem(refused, 403, RULE)
    assert _decisions_written(owner_engine, seeded.promotion_id) == 0


async def test_a_role_granted_after_the_promotion_opened_may_reject_but_not_approve(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    """The issue's operator: a person from before, whose operator role a second admin
    confirmed after the promotion opened. Rejecting needs no role age; approving does."""
    veteran = make_user(owner_engine, "ml_engineer")
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name)
    add_approval(owner_engine, seeded.promotion_id, "audit", people["auditor"].name)
    _grant_now(owner_engine, veteran.name, "operator")
    await console_session(console, veteran)
    page = (await console.get(f"/promotions/{seeded.promotion_id}")).text
    assert f'formaction="/promotions/{seeded.promotion_id}/reject"' in page
    assert ">Approve</button>" not in page
    offered = page.split('data-testid="not-offered"', 1)[1]
    assert "approve" in offered and RULE in offered


async def test_a_blank_comment_brings_the_form_back_with_the_input_and_the_error(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name)
    add_approval(owner_engine, seeded.promotion_id, "audit", people["auditor"].name)
    await console_session(console, people["operator"])
    form = await console.get(f"/promotions/{seeded.promotion_id}")
    sent = await console.post(f"/promotions/{seeded.promotion_id}/approve", data={
        "comment": "   ", "csrf_token": csrf_of(form.text)}, headers={"accept": "text/html"})
    assert sent.status_code == 422, sent.text
    assert sent.headers["content-type"].startswith("text/html")
    page = sent.text
    assert 'data-testid="comment-error"' in page and "only spaces" in page
    assert re.search(r'<textarea id="comment"[^>]*aria-invalid="true"[^>]*>   </textarea>', page)
    assert ">Approve</button>" in page  # the form is back, with its buttons
    assert _decisions_written(owner_engine, seeded.promotion_id) == 0


async def test_the_error_page_says_a_refusal_once_with_a_way_back(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name)
    auditor = people["auditor"]
    await console_session(console, auditor)
    where = f"http://testserver/promotions/{seeded.promotion_id}"
    form = await console.get(where)
    forged = await console.post(f"/promotions/{seeded.promotion_id}/approve", data={
        "comment": "forged", "csrf_token": csrf_of(form.text)},
        headers={"accept": "text/html", "referer": where})
    assert forged.status_code == 403
    assert forged.text.count(f"no rule lets user {auditor.name}") == 1, forged.text
    assert f'href="/promotions/{seeded.promotion_id}">Back to the page you came from' in forged.text
    assert seeded.workflow_id not in forged.text.split('id="main"', 1)[1]


async def test_the_sign_in_page_says_how_a_person_gets_a_token(
    console: httpx.AsyncClient,
) -> None:
    console.cookies.clear()
    page = (await console.get("/login")).text
    assert "users create" not in page  # founding admins only, on the server
    assert "users add" in page and "users token" in page


async def test_every_page_has_an_icon_and_no_favicon_404(
    console: httpx.AsyncClient, people: dict[str, Person],
) -> None:
    await console_session(console, people["operator"])
    home = (await console.get("/")).text
    assert '<link rel="icon" href="/static/favicon.svg"' in home
    for path in ("/static/favicon.svg", "/favicon.ico"):
        icon = await console.get(path)
        assert icon.status_code == 200, path
        assert icon.headers["content-type"].startswith("image/svg+xml")
        assert icon.text.startswith("<svg")


async def test_a_blank_rollback_reason_brings_the_confirmation_back(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            status="promoted", current_gate="watch")
    alias = uid("alias-").lower()
    insert(owner_engine, "deployment", alias=alias, checkpoint_id=seeded.checkpoint_id,
           updated_by="governance")
    for kind, checkpoint, previous in (("bootstrap", seeded.parent_id, None),
                                       ("promote", seeded.checkpoint_id, seeded.parent_id)):
        insert(owner_engine, "deployment_history", alias=alias, checkpoint_id=checkpoint,
               previous_checkpoint_id=previous, kind=kind, actor="governance", reason=kind)
    await console_session(console, people["operator"])
    form = await console.get(f"/rollback?alias={alias}")
    for reason, confirm, says in (("  ", "yes", "only spaces"),
                                  ("the canary regressed", "", "Tick the confirmation box")):
        sent = await console.post("/rollback", data={
            "alias": alias, "reason": reason, "confirm": confirm, "to_revision": "1",
            "csrf_token": csrf_of(form.text)}, headers={"accept": "text/html"})
        assert sent.status_code == 422, sent.text
        assert 'data-testid="reason-error"' in sent.text and says in sent.text
        assert f">{reason}</textarea>" in sent.text
        assert ">Roll back now</button>" in sent.text
