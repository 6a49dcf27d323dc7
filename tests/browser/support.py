"""What the browser tests share: Chromium, the stand-in governance workflows, a thread
with an event loop for them, signing in and screenshots."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, expect
from sqlalchemy import Engine, text
from temporalio import workflow

from tests.factories_web import (
    Person,
    SeededPromotion,
    add_approval,
    add_gate,
    make_promotion,
)
from triloop.config import Settings
from triloop.workflow_api import (
    GOVERNANCE_QUEUE,
    PROMOTION_APPROVE_UPDATE,
    PROMOTION_OVERRIDE_ALARMS_UPDATE,
    PROMOTION_SIGN_AUDIT_UPDATE,
    PROMOTION_STATUS_QUERY,
    PROMOTION_WORKFLOW,
    ROLLBACK_WORKFLOW,
    DecisionRef,
    GateSummary,
    PromotionInput,
    RollbackInput,
    RollbackResult,
)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"


@workflow.defn(name=PROMOTION_WORKFLOW)
class StandInPromotion:
    """Records each decision it is sent and returns; writes nothing anywhere."""

    def __init__(self) -> None:
        self.decisions: list[dict[str, Any]] = []

    @workflow.run
    async def run(self, candidate: PromotionInput) -> None:
        await workflow.wait_condition(lambda: len(self.decisions) >= 1)

    def _record(self, kind: str, gate: str, decision: DecisionRef) -> GateSummary:
        self.decisions.append({"kind": kind, "decision_id": decision.decision_id})
        return GateSummary(gate=gate, passed=True, verdict="pass",
                           reasons=[f"decision {decision.decision_id} recorded"])

    @workflow.update(name=PROMOTION_SIGN_AUDIT_UPDATE)
    def sign_audit(self, decision: DecisionRef) -> GateSummary:
        return self._record("audit", "audit", decision)

    @workflow.update(name=PROMOTION_APPROVE_UPDATE)
    def operator_decision(self, decision: DecisionRef) -> GateSummary:
        return self._record("operator", "approval", decision)

    @workflow.update(name=PROMOTION_OVERRIDE_ALARMS_UPDATE)
    def override_alarms(self, decision: DecisionRef) -> GateSummary:
        return self._record("alarm_override", "stability", decision)

    @workflow.query(name=PROMOTION_STATUS_QUERY)
    def status(self) -> list[dict[str, Any]]:
        return self.decisions


@workflow.defn(name=ROLLBACK_WORKFLOW)
class StandInRollback:
    """Answers a rollback as governance would, without touching anything."""

    @workflow.run
    async def run(self, request: RollbackInput) -> RollbackResult:
        return RollbackResult(alias=request.alias, checkpoint_id="stand-in-target",
                              previous_checkpoint_id="stand-in-current")


def recorded(engine: Engine, decision_id: str) -> tuple[Any, ...]:
    """(kind, user, decision, comment, recorded_by) of the decision row an update named."""
    with engine.connect() as conn:
        return tuple(conn.execute(text(
            "SELECT kind, user_name, decision, comment, recorded_by FROM human_decision"
            " WHERE id = :i"), {"i": decision_id}).one())


class Loop:
    """An asyncio loop in a thread, for the Temporal stand-in and calls to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def sign_in(page: Page, base_url: str, person: Person, target: str = "/") -> None:
    page.goto(f"{base_url}/login?next={target}")
    page.get_by_label("API token").fill(person.token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("banner").get_by_text(person.name, exact=True)).to_be_visible()


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def seeded_for_approval(engine: Engine, people: dict[str, Person]) -> SeededPromotion:
    seeded = make_promotion(engine, submitted_by=people["engineer"].name)
    add_gate(engine, seeded.promotion_id, "offline_eval", with_threshold=True, evidence={
        "eval_sets": [{"eval_set": "sorting-v1", "candidate": {"episodes": 120,
                                                               "success_rate": 0.81},
                       "production": {"episodes": 120, "success_rate": 0.74}}]})
    add_gate(engine, seeded.promotion_id, "shadow",
             evidence={"episodes": 200, "agreement_rate": 0.93})
    add_gate(engine, seeded.promotion_id, "canary",
             evidence={"episodes": 80, "share": 0.1, "success_rate_delta": 0.02})
    add_gate(engine, seeded.promotion_id, "audit", evidence={"user": people["auditor"].name})
    add_approval(engine, seeded.promotion_id, "audit", people["auditor"].name)
    return seeded


def start_stand_in(governance: tuple[Loop, Any], settings: Settings,
                   seeded: SeededPromotion) -> Any:
    loop, client = governance
    return loop.run(client.start_workflow(
        PROMOTION_WORKFLOW, PromotionInput(proposal_id="p", checkpoint_id=seeded.checkpoint_id,
                                           run_id=seeded.run_id, submitted_by="x"),
        id=seeded.workflow_id, task_queue=settings.task_queue(GOVERNANCE_QUEUE)))

