"""The console in a real browser (Debian's Chromium through Playwright) against the real stack.

The app runs under uvicorn in a background thread on a free port, as ``triloop_web``
against the test PostgreSQL, OPA and Temporal. A stand-in promotion workflow (the
real name, on this module's governance queue) answers the operator's update and
writes nothing. Screenshots of every page go to ``test-output/screenshots/``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import Engine, text

from tests.browser.support import (
    Loop,
    recorded,
    seeded_for_approval,
    shot,
    sign_in,
    start_stand_in,
)
from tests.factories import insert, make_run, uid
from tests.factories_web import (
    Person,
    add_gate,
    add_steps,
    make_deployment,
    make_promotion,
    make_user,
)
from tests.temporal_helpers import terminate_as_operator
from triloop.config import Settings
from triloop.workflow_api import (
    PROMOTION_STATUS_QUERY,
)

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_web_fixtures"]


def test_operator_signs_in_and_approves_a_promotion(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine,
    governance: tuple[Loop, Any], browser_settings: Settings,
) -> None:
    seeded = seeded_for_approval(owner_engine, people)
    handle = start_stand_in(governance, browser_settings, seeded)
    page.goto(f"{base_url}/")
    expect(page).to_have_url(f"{base_url}/login?next=/")
    shot(page, "login")
    operator = people["operator"]
    sign_in(page, base_url, operator)
    waiting = page.get_by_role("region", name="Waiting for you")
    link = waiting.locator(f"a[href='/promotions/{seeded.promotion_id}']")
    expect(link).to_be_visible()
    shot(page, "overview")
    link.click()
    expect(page.get_by_role("heading", name="Your decision (operator)")).to_be_visible()
    expect(page.get_by_test_id("verdict-offline_eval")).to_contain_text(
        "all 3 checks met their bars")
    shot(page, "promotion")
    page.get_by_role("button", name="Approve").click()  # empty comment: the browser refuses
    expect(page).to_have_url(f"{base_url}/promotions/{seeded.promotion_id}")
    page.get_by_label("Comment").fill("Offline, shadow and canary gates are green.")
    page.get_by_role("button", name="Approve").click()
    notice = page.get_by_role("status")
    expect(notice).to_contain_text(f"Approved as {operator.name}")
    shot(page, "promotion-approved")
    loop, _ = governance
    [sent] = loop.run(handle.query(PROMOTION_STATUS_QUERY))
    assert sent["kind"] == "operator"
    assert recorded(owner_engine, sent["decision_id"]) == (
        "approval", operator.name, "approve", "Offline, shadow and canary gates are green.",
        "triloop_web")


def test_auditor_sees_no_approve_button_and_a_forged_post_is_refused(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine,
    governance: tuple[Loop, Any], browser_settings: Settings,
) -> None:
    seeded = seeded_for_approval(owner_engine, people)
    handle = start_stand_in(governance, browser_settings, seeded)
    sign_in(page, base_url, people["auditor"], f"/promotions/{seeded.promotion_id}")
    expect(page.get_by_role("heading", name="Gates")).to_be_visible()
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    expect(page.get_by_role("button", name="Reject")).to_have_count(0)
    expect(page.get_by_role("link", name="Roll back production…")).to_have_count(0)
    shot(page, "promotion-as-auditor")
    csrf = page.locator("input[name=csrf_token]").first.get_attribute("value")
    assert csrf
    forged = page.request.post(f"{base_url}/promotions/{seeded.promotion_id}/approve",
                               form={"csrf_token": csrf, "comment": "forged approval"},
                               headers={"Accept": "text/html"}, max_redirects=0)
    assert forged.status == 403
    assert "no rule lets" in forged.text() or "may not" in forged.text()
    no_csrf = page.request.post(f"{base_url}/promotions/{seeded.promotion_id}/approve",
                                form={"comment": "forged"}, max_redirects=0)
    assert no_csrf.status == 403 and "CSRF" in no_csrf.text()
    loop, _ = governance
    assert loop.run(handle.query(PROMOTION_STATUS_QUERY)) == []
    loop.run(terminate_as_operator(browser_settings, handle))


def test_operator_overrides_a_candidates_alarms_and_an_auditor_only_sees_them(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine,
    governance: tuple[Loop, Any], browser_settings: Settings,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            current_gate="stability")
    with owner_engine.begin() as conn:
        conn.execute(text(  # each alarm is stored whole in metrics (migration 0019)
            "INSERT INTO training_step (run_id, iteration, alarms, length_stats, metrics)"
            " VALUES (:r, 10, '{template_collapse}', '{}', CAST(:m AS jsonb))"),
            {"r": seeded.run_id, "m": json.dumps({"alarms": [{
                "kind": "template_collapse", "iteration": 10,
                "message": "retrieval accuracy near chance", "evidence": {}}]})})
        conn.execute(text("UPDATE proposal SET evidence = '{\"iteration\": 10}' WHERE id ="
                          " (SELECT proposal_id FROM promotion WHERE id = :p)"),
                     {"p": seeded.promotion_id})
    handle = start_stand_in(governance, browser_settings, seeded)
    sign_in(page, base_url, people["auditor"], f"/promotions/{seeded.promotion_id}")
    alarms = page.get_by_role("region", name="Stability alarms")
    expect(alarms).to_contain_text("template collapse at iteration 10")
    expect(page.get_by_role("button", name="Override alarms")).to_have_count(0)
    page.context.clear_cookies()
    operator = people["operator"]
    sign_in(page, base_url, operator, f"/promotions/{seeded.promotion_id}")
    expect(page.get_by_role("heading", name="Override the stability alarms (operator)")
           ).to_be_visible()
    shot(page, "promotion-alarms")
    page.get_by_label("Reason").fill("Collapse alarms are expected on this toy task.")
    page.get_by_role("button", name="Override alarms").click()
    expect(page.get_by_role("status")).to_contain_text(
        f"Stability alarms overridden as {operator.name}")
    loop, _ = governance
    [sent] = loop.run(handle.query(PROMOTION_STATUS_QUERY))
    assert recorded(owner_engine, sent["decision_id"]) == (
        "alarm_override", operator.name, "override",
        "Collapse alarms are expected on this toy task.", "triloop_web")


def test_auditor_signs_the_audit_from_the_promotion_page(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine,
    governance: tuple[Loop, Any], browser_settings: Settings,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            current_gate="audit")
    add_gate(owner_engine, seeded.promotion_id, "offline_eval", with_threshold=True)
    handle = start_stand_in(governance, browser_settings, seeded)
    sign_in(page, base_url, people["auditor"], f"/promotions/{seeded.promotion_id}")
    expect(page.get_by_role("heading", name="Audit sign-off (auditor)")).to_be_visible()
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    shot(page, "promotion-audit-form")
    page.get_by_label("Audit comment").fill("Lineage, eval set hashes and evidence checked.")
    page.get_by_role("button", name="Sign audit").click()
    expect(page.get_by_role("status")).to_contain_text("Audit signed as")
    loop, _ = governance
    [sent] = loop.run(handle.query(PROMOTION_STATUS_QUERY))
    assert sent["kind"] == "audit"
    assert recorded(owner_engine, sent["decision_id"])[:3] == (
        "audit", people["auditor"].name, "sign")


def test_lineage_page_shows_the_parent_chain_and_verifies_the_audit_chain(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine
) -> None:
    seeded = seeded_for_approval(owner_engine, people)
    sign_in(page, base_url, people["auditor"], f"/checkpoints/{seeded.checkpoint_id}/lineage")
    chain = page.get_by_role("list", name="Parent chain, base model first").locator(":scope > li")
    expect(chain).to_have_count(3)  # the base (the root checkpoint) is drawn once
    expect(chain.nth(0)).to_contain_text("base model")
    for index, checkpoint in enumerate((seeded.root_id, seeded.parent_id, seeded.checkpoint_id)):
        expect(chain.nth(index)).to_contain_text(checkpoint)
    expect(chain.nth(2)).to_contain_text("candidate")
    expect(page.get_by_role("region", name="Frozen eval sets used")).to_contain_text("v1")
    page.get_by_role("button", name="Verify audit chain").click()
    expect(page.get_by_role("status")).to_contain_text("Audit chain verified")
    shot(page, "lineage")
    chain.nth(1).get_by_role("link").first.click()
    expect(page).to_have_url(f"{base_url}/checkpoints/{seeded.parent_id}/lineage")


def test_every_page_renders_for_its_roles(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine
) -> None:
    run_id = make_run(owner_engine, submitted_by=people["engineer"].name)
    add_steps(owner_engine, run_id, 12, alarm_at=9)
    seeded = seeded_for_approval(owner_engine, people)
    alias_target = make_promotion(owner_engine, submitted_by=people["engineer"].name)
    if _no_production(owner_engine):
        make_deployment(owner_engine, "production", seeded.checkpoint_id,
                        alias_target.checkpoint_id)
    everyone = make_user(owner_engine, "operator", "auditor")
    sign_in(page, base_url, everyone)
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    pages = {
        "runs": "/runs", "run": f"/runs/{run_id}", "promotions": "/promotions",
        "deployments": "/deployments", "rollback-confirm": "/rollback?alias=production",
        "environments": "/environments", "audit-log": "/audit",
    }
    for name, path in pages.items():
        response = page.goto(f"{base_url}{path}")
        assert response is not None and response.status == 200, (path, response)
        expect(page.locator("h1")).to_be_visible()
        shot(page, name)
    page.goto(f"{base_url}/runs/{run_id}")
    expect(page.get_by_role("img", name="Reward (mean)", exact=False)).to_be_visible()
    expect(page.locator("#charts")).to_have_attribute("data-alarm-count", "1")
    expect(page.get_by_role("button", name="Pause")).to_have_count(0)  # not the owner
    # Live: a new iteration with an alarm appears without a reload.
    insert(owner_engine, "training_step", run_id=run_id, iteration=12, reward_mean=0.9,
           entropy=0.8, kl=0.12, grad_norm=0.9, discrimination=0.78, alarms=["template_collapse"],
           length_stats={}, metrics={})
    expect(page.locator("#charts")).to_have_attribute("data-last-iteration", "12",
                                                      timeout=20_000)
    expect(page.locator("#charts")).to_have_attribute("data-alarm-count", "2")
    name = seed_environment(owner_engine)
    page.goto(f"{base_url}/environments")
    page.get_by_role("link", name=name).click()
    expect(page.get_by_role("heading", name="Versions")).to_be_visible()
    page.get_by_label("From").select_option("1")
    page.get_by_label("to", exact=True).select_option("2")
    page.get_by_role("button", name="Show diff").click()
    expect(page.locator("table.diff tbody tr")).to_have_count(3)
    page.locator("details.task summary").first.click()
    expect(page.get_by_text("3 resets gave identical state hashes")).to_be_visible()
    shot(page, "environment")
    page.goto(f"{base_url}/promotions/nope")
    expect(page.get_by_role("heading", name="404 · Not found")).to_be_visible()


def seed_environment(engine: Engine) -> str:
    """An environment with two contract versions and a task with admission evidence."""
    name = uid("sorting-")
    insert(engine, "environment", name=name, description="Sort a list with swaps",
           created_by="governance")
    contracts = [
        {"task": "sort", "allowed_actions": ["read", "swap", "done"], "reward": {"success": 1.0}},
        {"task": "sort", "allowed_actions": ["read", "done"], "reward": {"success": 1},
         "observations": ["list"]},
    ]
    version_ids = []
    for number, contract in enumerate(contracts, start=1):
        version_ids.append(uid("sha-"))
        insert(engine, "environment_version", id=version_ids[-1], environment_name=name,
               version=number, contract=contract, contract_text=yaml_text(contract),
               fixture_hashes={"lists.json": "5f" * 32}, created_by="governance")
    insert(engine, "task", id=uid("task-"), environment_version_id=version_ids[-1], seed=7,
           status="admitted", decided_by="governance", evidence={
               "reproducible": {"answer": True,
                                "evidence": "3 resets gave identical state hashes"},
               "verifiable": {"answer": True, "evidence": "checker reads the final list"},
               "recoverable": {"answer": True, "evidence": "reset in 4 ms"},
               "repeatable": {"answer": True, "successes": 4, "samples": 5}})
    return name


def yaml_text(contract: dict[str, Any]) -> str:
    import yaml

    return str(yaml.safe_dump(contract, sort_keys=False))


def test_owner_controls_a_run_and_operator_rolls_back_with_confirmation(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine,
    governance: tuple[Loop, Any],
) -> None:
    run_id = make_run(owner_engine, submitted_by=people["engineer"].name)
    sign_in(page, base_url, people["engineer"], f"/runs/{run_id}")
    for name in ("Pause", "Cancel"):
        expect(page.get_by_role("button", name=name)).to_be_visible()
    # A run that is not paused is not offered Resume.
    expect(page.get_by_role("button", name="Resume")).to_have_count(0)
    page.get_by_role("button", name="Pause").click()  # the run has no workflow yet: a 409
    expect(page.get_by_role("heading", name="409 · Conflict")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("no workflow yet")

    page.context.clear_cookies()
    checkpoint = make_promotion(owner_engine, submitted_by=people["engineer"].name)
    alias = uid("console-").lower()
    make_deployment(owner_engine, alias, checkpoint.checkpoint_id, checkpoint.parent_id)
    sign_in(page, base_url, people["operator"], "/deployments")
    page.locator(f"a[href='/rollback?alias={alias}']").first.click()
    expect(page.get_by_role("heading", name=f"Roll back {alias}?")).to_be_visible()
    page.get_by_label("Reason").fill("canary regression seen by on-call")
    page.get_by_role("button", name="Roll back now").click()  # box not ticked: browser refuses
    expect(page.get_by_role("heading", name=f"Roll back {alias}?")).to_be_visible()
    page.get_by_label("I confirm rolling back").check()
    page.get_by_role("button", name="Roll back now").click()
    expect(page.get_by_role("status")).to_contain_text(
        f"Rolled back {alias}: now stand-in-target (was stand-in-current)")
    with owner_engine.connect() as conn:
        reasons = conn.execute(text(
            "SELECT comment FROM human_decision WHERE kind = 'rollback' AND subject = :a"),
            {"a": alias}).scalars().all()
    assert reasons == ["canary regression seen by on-call"]
    shot(page, "deployments-after-rollback")


def _no_production(engine: Engine) -> bool:
    with engine.begin() as conn:
        count = conn.execute(text("SELECT count(*) FROM deployment WHERE alias='production'"))
        return int(count.scalar_one()) == 0
