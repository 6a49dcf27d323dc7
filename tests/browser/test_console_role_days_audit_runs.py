"""The auditor's and the ML engineer's days in Chromium, and an open gate's traffic count.

The auditor narrows the audit log by kind, decision, actor and time range, then downloads
the same events as CSV and JSON from the page's export links and reads what came down.
The engineer submits a run through the API, watches it on its page (status and iteration
update live), sees it pause on an alarm and resumes it from the console; another engineer
gets no controls and is refused if they post the form anyway. An operator looking at an
open shadow gate sees how much production traffic it has counted against its bar.
Screenshots at desktop width and at 390 px go to ``test-output/screenshots/``.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import Engine, text
from temporalio import workflow
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.browser.support import Loop, shot, sign_in
from tests.factories import insert, make_task, uid
from tests.factories_traffic import hold_slot, promotion_at_gate, task_of, write_shadow_pairs
from tests.factories_web import Person, add_steps, make_user
from triloop.audit import append_event
from triloop.config import Settings
from triloop.db import session_scope
from triloop.temporal import connect
from triloop.workflow_api import (
    LEARNING_QUEUE,
    RUN_CANCEL_SIGNAL,
    RUN_PAUSE_SIGNAL,
    RUN_RESUME_SIGNAL,
    RUN_STATUS_QUERY,
    TRAINING_RUN_WORKFLOW,
    RunControl,
    TrainingRunInput,
)

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_web_fixtures"]

PHONE = {"width": 390, "height": 844}


def body_overflow(page: Page) -> int:
    """How many CSS pixels the page is wider than the viewport (0 when nothing overflows)."""
    return int(page.evaluate(
        "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
        " - document.documentElement.clientWidth"))


# --- the auditor ---------------------------------------------------------------------------

def _seed_events(engine: Engine, kind: str, actor: str, other: str) -> int:
    """Four events of which only the first is (kind, allow, actor); returns its seq."""
    rows = [(actor, "sign", kind, "allow"), (actor, "approve", kind, "deny"),
            (other, "sign", kind, "allow"), (actor, "sign", "deployment", "allow")]
    seqs = []
    for who, action, resource_kind, decision in rows:
        with session_scope(engine) as session:
            seqs.append(append_event(session, actor={"user": who, "roles": ["operator"]},
                                     action=action, decision=decision,
                                     resource={"kind": resource_kind, "id": uid("r-")},
                                     payload={"why": "auditor's day"}).seq)
    return seqs[0]


def _minute(moment: datetime) -> str:
    """What a datetime-local input takes (the console reads it as UTC)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


def _download(page: Page, link: str) -> str:
    with page.expect_download() as info:
        page.locator("p.export").get_by_role("link", name=link).click()
    return info.value.path().read_text(encoding="utf-8")


def test_auditor_filters_the_audit_log_and_exports_what_they_see(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine,
) -> None:
    kind, actor, other = "promotion", uid("actor-").lower(), uid("actor-").lower()
    wanted = _seed_events(owner_engine, kind, actor, other)
    now = datetime.now(UTC)
    sign_in(page, base_url, people["auditor"], "/audit")

    page.get_by_label("Kind").select_option(kind)  # a word of the log, not typed
    page.get_by_label("Decision").select_option("allow")
    page.get_by_label("Actor").fill(actor)
    page.get_by_label("From").fill(_minute(now - timedelta(minutes=10)))
    page.get_by_label("Until").fill(_minute(now + timedelta(minutes=10)))
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("table tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first.locator("td").first).to_have_text(str(wanted))
    expect(rows.first).to_contain_text(actor)
    expect(page.get_by_label("Decision")).to_have_value("allow")  # the form keeps the filter
    shot(page, "day-auditor-filtered")

    as_csv = list(csv.DictReader(io.StringIO(_download(page, "CSV"))))
    assert [int(r["seq"]) for r in as_csv] == [wanted]
    assert (as_csv[0]["decision"], as_csv[0]["actor_user"], as_csv[0]["resource_kind"],
            as_csv[0]["action"]) == ("allow", actor, kind, "sign")
    as_json = json.loads(_download(page, "JSON"))
    assert [e["seq"] for e in as_json] == [wanted]
    assert as_json[0]["actor"]["user"] == actor and as_json[0]["resource"]["kind"] == kind

    # A time range that ends before the events holds none of them, on the page or exported.
    page.get_by_label("Until").fill(_minute(now - timedelta(minutes=5)))
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("table tbody tr")).to_have_count(0)
    assert list(csv.DictReader(io.StringIO(_download(page, "CSV")))) == []

    page.set_viewport_size(PHONE)
    page.reload()
    expect(page.get_by_role("heading", name="Audit log")).to_be_visible()
    assert body_overflow(page) <= 0
    shot(page, "day-auditor-filtered-390")


# --- the ML engineer -----------------------------------------------------------------------

@workflow.defn(name=TRAINING_RUN_WORKFLOW)
class StandInTrainingRun:
    """Records its start and every control signal it receives; writes nothing."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.cancelled = False

    @workflow.run
    async def run(self, run: TrainingRunInput) -> None:
        self.seen.append(f"start {run.run_id}")
        await workflow.wait_condition(lambda: self.cancelled)

    @workflow.signal(name=RUN_PAUSE_SIGNAL)
    def pause(self, control: RunControl) -> None:
        self.seen.append(f"pause {control.decision_id}")

    @workflow.signal(name=RUN_RESUME_SIGNAL)
    def resume(self, control: RunControl) -> None:
        self.seen.append(f"resume {control.decision_id}")

    @workflow.signal(name=RUN_CANCEL_SIGNAL)
    def cancel(self, control: RunControl) -> None:
        self.seen.append(f"cancel {control.decision_id}")
        self.cancelled = True

    @workflow.query(name=RUN_STATUS_QUERY)
    def status(self) -> list[str]:
        return self.seen


@pytest.fixture(scope="module")
def learning(browser_settings: Settings) -> Iterator[tuple[Loop, Any]]:
    """A stand-in learning worker on the browser tests' queue; yields the loop and client."""
    loop = Loop()
    client = loop.run(connect(browser_settings, identity="test-browser-learning",
                              service="learning"))
    worker = Worker(client, task_queue=browser_settings.task_queue(LEARNING_QUEUE),
                    workflows=[StandInTrainingRun], workflow_runner=UnsandboxedWorkflowRunner())
    running = asyncio.run_coroutine_threadsafe(worker.run(), loop.loop)
    yield loop, client
    loop.run(worker.shutdown())
    running.result(10)
    loop.stop()


def _learning_reports(engine: Engine, run_id: str, status: str, iterations: int,
                      reason: str | None = None) -> None:
    """What the learning loop writes as the run goes (status and iterations done)."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE training_run SET status = :s, iterations_done = :n, "
                          "status_reason = :r WHERE id = :i"),
                     {"s": status, "n": iterations, "r": reason, "i": run_id})


def test_engineer_submits_watches_and_resumes_a_paused_run(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine,
    learning: tuple[Loop, Any],
) -> None:
    engineer = people["engineer"]
    config = {"name": uid("day-run-"), "model": {"base": "/models/tiny-local"},
              "rollout": {"task_ids": [make_task(owner_engine)], "group_size": 2}}
    submitted = httpx.post(f"{base_url}/api/runs", json={"config": config},
                           headers=engineer.headers, timeout=30)
    assert submitted.status_code == 201, submitted.text
    run = submitted.json()
    loop, client = learning
    handle = client.get_workflow_handle(run["workflow_id"])

    add_steps(owner_engine, run["id"], 3)
    _learning_reports(owner_engine, run["id"], "running", 3)
    sign_in(page, base_url, engineer, f"/runs/{run['id']}")
    expect(page.locator("#run-status")).to_contain_text("running")
    expect(page.locator("#run-iterations")).to_have_text("3")
    controls = page.get_by_role("region", name="Control this run")
    for action in ("Pause", "Cancel"):
        expect(controls.get_by_role("button", name=action)).to_be_visible()
    expect(controls.get_by_role("button", name="Resume")).to_have_count(0)  # it runs

    # The run alarms and pauses itself; the open page follows without a reload.
    insert(owner_engine, "training_step", run_id=run["id"], iteration=3, loss=0.8, kl=0.03,
           entropy=1.6, reward_mean=0.35, grad_norm=0.9, discrimination=0.5,
           alarms=["echo_trap"], length_stats={}, metrics={})
    _learning_reports(owner_engine, run["id"], "paused", 4,
                      "paused after iteration 3: echo_trap alarm (stability.pause_on_alarm)")
    expect(page.locator("#run-status")).to_contain_text("paused", timeout=20_000)
    expect(page.locator("#run-iterations")).to_have_text("4")
    page.reload()
    expect(page.get_by_text("paused after iteration 3: echo_trap alarm")).to_be_visible()
    shot(page, "day-engineer-paused-run")

    controls.get_by_role("button", name="Resume").click()
    expect(page.locator(".notice[role=status]")).to_contain_text("Sent resume to the run")
    seen: list[str] = loop.run(handle.query(RUN_STATUS_QUERY))
    assert seen[0] == f"start {run['id']}" and seen[-1].startswith("resume ")
    decision_id = seen[-1].split()[1]
    with owner_engine.connect() as conn:
        row = conn.execute(text("SELECT kind, subject, decision, user_name, recorded_by "
                                "FROM human_decision WHERE id = :i"), {"i": decision_id}).one()
    assert tuple(row) == ("run_control", run["id"], "resume", engineer.name, "triloop_web")

    page.set_viewport_size(PHONE)
    page.reload()
    expect(controls.get_by_role("button", name="Resume")).to_be_visible()
    assert body_overflow(page) <= 0
    shot(page, "day-engineer-paused-run-390")

    # Someone else's run: no controls, and posting the form anyway is refused server-side.
    stranger = make_user(owner_engine, "ml_engineer")
    page.context.clear_cookies()
    sign_in(page, base_url, stranger, f"/runs/{run['id']}")
    expect(page.locator("#run-status")).to_be_visible()
    expect(page.get_by_role("region", name="Control this run")).to_have_count(0)
    refused = page.evaluate(
        """async (runId) => {
             const csrf = document.querySelector('input[name=csrf_token]').value;
             const r = await fetch(`/runs/${runId}/resume`, {method: 'POST',
               body: new URLSearchParams({csrf_token: csrf}), redirect: 'manual'});
             return r.status; }""", run["id"])
    assert refused == 403
    assert loop.run(handle.query(RUN_STATUS_QUERY)) == seen  # nothing more reached the run
    loop.run(handle.signal(RUN_CANCEL_SIGNAL, RunControl("test cleanup")))


# --- an open gate waiting for traffic ------------------------------------------------------

def test_an_open_shadow_gate_shows_its_traffic_count(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = promotion_at_gate(owner_engine, people, "shadow", {"shadow": {"min_samples": 12}})
    hold_slot(owner_engine, "shadow", seeded)
    try:
        write_shadow_pairs(owner_engine, seeded, task_of(owner_engine, seeded), 3)
        sign_in(page, base_url, people["operator"], f"/promotions/{seeded.promotion_id}")
        expect(page.get_by_test_id("traffic-progress")).to_have_text(
            "Waiting for production traffic: 3 of 12 paired episodes.")
        shot(page, "day-gate-waiting-for-traffic")
        page.set_viewport_size(PHONE)
        page.reload()
        expect(page.get_by_test_id("traffic-progress")).to_be_visible()
        assert body_overflow(page) <= 0
        shot(page, "day-gate-waiting-for-traffic-390")
    finally:
        hold_slot(owner_engine, "shadow", None)
