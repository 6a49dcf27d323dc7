"""What an auditor reads, in Chromium: /docs draws the OpenAPI 3.1 document, the audit log
shows one row per act, and the lineage, history and promotion pages fit their screens.

Screenshots at 1440 px and at 390 px go to ``test-output/screenshots/``.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import pytest
from playwright.sync_api import Page, ViewportSize, expect
from sqlalchemy import Engine

from tests.browser.support import seeded_for_approval, shot, sign_in
from tests.factories import insert, make_checkpoint, make_run, record_decision, uid
from tests.factories_web import Person, add_gate, make_promotion, make_user
from triloop.audit import append_event
from triloop.db import session_scope
from triloop.decisions import audit_refusal

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_web_fixtures"]

DESKTOP: ViewportSize = {"width": 1440, "height": 900}
PHONE: ViewportSize = {"width": 390, "height": 844}


def body_overflow(page: Page) -> int:
    """How many CSS pixels the page is wider than the viewport (0 when nothing overflows)."""
    return int(page.evaluate(
        "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
        " - document.documentElement.clientWidth"))


def test_docs_render_the_openapi_3_1_document(page: Page, base_url: str) -> None:
    failed: list[str] = []
    page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
    for size, suffix in ((DESKTOP, "1440"), (PHONE, "390")):
        page.set_viewport_size(size)
        page.goto(f"{base_url}/docs")
        # Swagger UI 4 read the 3.1 document as "Unable to render this definition".
        expect(page.locator(".swagger-ui .info .title")).to_contain_text("triloop")
        expect(page.locator(".swagger-ui .info .version-stamp")).to_contain_text("OAS 3.1")
        audit = page.locator("#operations-tag-audit")
        expect(audit).to_be_visible()
        expect(page.get_by_text("Unable to render this definition")).to_have_count(0)
        expect(page.locator(".swagger-ui .errors-wrapper")).to_have_count(0)
        # An operation opens with its parameters, drawn from the document.
        page.locator("#operations-audit-list_audit_events, [id^='operations-audit-']").first \
            .locator(".opblock-summary").first.click()
        expect(page.locator(".opblock.is-open .parameters").first).to_be_visible()
        shot(page, f"docs-{suffix}")
    assert failed == [], failed


# --- the audit log for people -------------------------------------------------------------

def _seed_person_day(engine: Engine, person: Person) -> dict[str, Any]:
    """A person's day as the log holds it: 35 production episodes (traffic), an approve the
    policy allowed and governance's workflow then refused (authorization + outcome, one
    decision id), and governance's refusal of a decision they recorded."""
    seeded = make_promotion(engine, submitted_by="someone-else")
    actor = {"service": "web", "user": person.name, "roles": ["operator"]}
    with session_scope(engine) as session:
        for _ in range(35):
            append_event(session, actor=actor, action="create", decision="allow",
                         decision_id=uid("opa-"), resource={"kind": "trajectory"},
                         payload={"reasons": []})
        decision_id = uid("opa-")
        append_event(session, actor=actor, action="approve", decision="allow",
                     decision_id=decision_id, payload={"reasons": []},
                     resource={"kind": "promotion", "id": seeded.promotion_id})
        append_event(session, actor=actor, action="approve", decision="deny",
                     decision_id=decision_id, resource={"kind": "promotion",
                                                        "id": seeded.promotion_id},
                     payload={"outcome": "refused", "status": 409,
                              "detail": "the promotion is not waiting for an approval",
                              "reasons": ["the promotion is not waiting for an approval"]})
    human = record_decision(engine, kind="approval", subject=seeded.promotion_id,
                            decision="approve", user=person.name)
    audit_refusal(engine, service="governance", action="approve",
                  resource={"kind": "promotion", "id": seeded.promotion_id},
                  decision_id=human, reason="their role became active after the promotion"
                  " opened; a person whose role predates the promotion must decide")
    return {"promotion_id": seeded.promotion_id}


def test_the_audit_log_shows_one_row_per_act_with_its_reason_and_the_persons_refusals(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine,
) -> None:
    person = make_user(owner_engine, "operator")
    seeded = _seed_person_day(owner_engine, person)
    page.set_viewport_size(DESKTOP)
    sign_in(page, base_url, people["auditor"], "/audit")
    page.get_by_label("Person").fill(person.name)
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("table.audit-log tbody tr")
    # Governance's refusal about their decision, and their approve (allowed, then refused):
    # one row each; not the outcome's own row, not the 35 episodes.
    expect(rows).to_have_count(2)
    refusal, approve = rows.nth(0), rows.nth(1)
    expect(refusal).to_contain_text("governance")
    expect(refusal).to_contain_text("denied")
    expect(refusal).to_contain_text("role became active after the promotion opened")
    expect(approve).to_contain_text("refused")
    expect(approve).to_contain_text("not waiting for an approval")
    link = approve.get_by_role("link", name=seeded["promotion_id"][:12], exact=False)
    expect(link).to_have_attribute("href", f"/promotions/{seeded['promotion_id']}")
    # Kind and action are chosen from the log's words, not typed.
    expect(page.get_by_label("Action").locator("option[value='approve']")).to_have_count(1)
    page.get_by_label("Action").select_option("approve")
    page.get_by_label("Kind").select_option("promotion")
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(2)
    shot(page, "audit-person-1440")
    assert body_overflow(page) <= 0
    # Asked for, the person's traffic is there too.
    page.goto(f"{base_url}/audit?person={person.name}&traffic=1")
    expect(rows).to_have_count(30)  # a page of them
    page.goto(f"{base_url}/audit?person={person.name}")
    page.set_viewport_size(PHONE)
    expect(rows).to_have_count(2)
    assert body_overflow(page) <= 0
    shot(page, "audit-person-390")


# --- lineage, history and promotion layout ------------------------------------------------

def _long_lineage(engine: Engine, people: dict[str, Person]) -> tuple[str, str]:
    """A base, then 16 iterations of one run; returns (base id, candidate id)."""
    run_id = make_run(engine, submitted_by=people["engineer"].name)
    base = make_checkpoint(engine, name=uid("base-"), source_kind="huggingface",
                           parameter_count=135_000_000, dtype="bfloat16",
                           tokenizer_sha256=hashlib.sha256(b"tok").hexdigest())
    parent = base
    tasks = [uuid.uuid4().hex for _ in range(3)]  # full-length ids, as the demo's are
    for iteration in range(1, 17):
        parent = make_checkpoint(engine, id=hashlib.sha256(uid().encode()).hexdigest(),
                                 artifact_uri="file:///nowhere", parent_id=parent,
                                 run_id=run_id, iteration=iteration,
                                 data={"trajectories": 40 * iteration, "tasks": tasks})
    return base, parent


def test_the_lineage_page_draws_the_base_once_and_folds_a_runs_iterations(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine,
) -> None:
    base, candidate = _long_lineage(owner_engine, people)
    page.set_viewport_size(DESKTOP)
    sign_in(page, base_url, people["auditor"], f"/checkpoints/{candidate}/lineage")
    graph = page.locator("ol.lineage").first
    expect(graph.locator(":scope > li.node-base")).to_have_count(1)
    expect(page.locator(f"#ckpt-{base}")).to_have_count(1)  # the base, drawn once
    # First and last iteration shown, the 14 between folded (and there when opened).
    expect(graph.locator(":scope > li")).to_have_count(4)
    folded = graph.locator("li.node-folded")
    expect(folded).to_contain_text("14 more checkpoints")
    expect(folded).to_contain_text("iterations 2–15")
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height < 2000, height
    shot(page, "lineage-1440")
    folded.locator("summary").click()
    expect(folded.locator("li.node")).to_have_count(14)
    page.set_viewport_size(PHONE)
    assert body_overflow(page) <= 0, overflowing(page)
    shot(page, "lineage-390")


def test_the_history_table_fits_1440_and_lineage_and_promotion_fit_390(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = seeded_for_approval(owner_engine, people)
    alias = uid("fit-").lower()
    insert(owner_engine, "deployment", alias=alias, checkpoint_id=seeded.parent_id,
           updated_by="governance")
    # What governance wrote before reasons lost their ids: one unbroken 90-character word.
    workflow = f"promotion-{uuid.uuid4().hex}/{uuid.uuid4()}/32"
    sha = hashlib.sha256(workflow.encode()).hexdigest()
    long_reason = (f"rollback [{workflow}]: watch: success rate 0.41 fell below the"
                   f" production baseline 0.74 over 120 episodes of {sha}")
    add_gate(owner_engine, seeded.promotion_id, "watch", passed=False,
             reasons=[long_reason, f"rolled back to {seeded.parent_id} by {workflow}"],
             evidence={"episodes": 120, "workflow": workflow})
    for kind, checkpoint, previous, reason in (
            ("bootstrap", seeded.root_id, None, "bootstrap"),
            ("promote", seeded.parent_id, seeded.root_id, f"promotion {seeded.promotion_id}"
                                                         " approved by an operator"),
            ("promote", seeded.checkpoint_id, seeded.parent_id,
             f"promotion {uuid.uuid4().hex} approved by {people['operator'].name}"),
            ("rollback", seeded.parent_id, seeded.checkpoint_id, long_reason)):
        insert(owner_engine, "deployment_history", alias=alias, checkpoint_id=checkpoint,
               previous_checkpoint_id=previous, kind=kind, actor="governance", reason=reason)
    page.set_viewport_size(DESKTOP)
    sign_in(page, base_url, people["operator"], "/deployments")
    history = page.locator(f"section[aria-labelledby='history-{alias}'] table.history")
    expect(history).to_be_visible()
    scroller = history.locator("xpath=..")
    shot(page, "deployments-history-1440")
    assert scroller.evaluate("e => e.scrollWidth - e.clientWidth") <= 0, "history overflows"
    assert body_overflow(page) <= 0
    page.set_viewport_size(PHONE)
    for path, name in ((f"/promotions/{seeded.promotion_id}", "promotion"),
                       (f"/checkpoints/{seeded.checkpoint_id}/lineage", "lineage-short")):
        page.goto(f"{base_url}{path}")
        expect(page.locator("h1").first).to_be_visible()
        shot(page, f"{name}-390")
        assert body_overflow(page) <= 0, (name, body_overflow(page), overflowing(page))


def overflowing(page: Page) -> list[str]:
    """The first elements wider than the viewport, to say what overflows."""
    return list(page.evaluate(
        "[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect()"
        ".right > document.documentElement.clientWidth + 1).slice(0, 6)"
        ".map(e => e.tagName + '.' + e.className + ' ' + (e.textContent || '').slice(0, 40))"))
