"""The promotion page in a browser, at desktop and phone width: gate summaries above the
rows they count, the reward-attribution table and the shortcut audit (flagged signals
highlighted), nothing wider than the screen. Screenshots go to test-output/screenshots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import Engine

from governance_loop.gates.canary import CanaryObservation, decide_canary
from governance_loop.gates.offline_eval import EvalSetResult, decide_offline_eval
from governance_loop.gates.shadow import ShadowSample, decide_shadow
from governance_loop.gates.stats import BinomialCounts, EpisodeStats
from governance_loop.gates.thresholds import ThresholdSpec
from tests.browser.support import shot, sign_in
from tests.browser.test_console_days import PHONE, body_overflow
from tests.factories_gate_evidence import AUDIT, SHORTCUT
from tests.factories_web import Person, add_gate, make_promotion

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_web_fixtures"]

SPEC = ThresholdSpec.from_mapping({
    "version": "t-27", "min_success_rate": 0.0, "max_regression_vs_production": 0.05,
    "max_reward_regression_vs_production": 0.0, "min_samples": 10,
    "shadow": {"min_samples": 12, "max_mean_reward_regression": 0.0},
    "canary": {"min_samples_per_arm": 40, "regression_to_detect": 0.2}})
DESKTOP = {"width": 1440, "height": 900}
# A copy for a person to look at, when asked for (H4_SHOTS=/tmp/...).
EXTRA = os.environ.get("H4_SHOTS")


def _shot(page: Page, name: str) -> None:
    shot(page, name)
    if EXTRA:
        Path(EXTRA).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=f"{EXTRA}/{name}.png", full_page=True)


def test_gate_summaries_and_the_shortcut_evidence_read_at_both_widths(
    page: Page, base_url: str, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            status="failed", current_gate="canary")
    offline = decide_offline_eval([EvalSetResult(
        "maps@v1", "v1", EpisodeStats(64, 1, 0.42, 0.3), EpisodeStats(64, 0, 0.04, 0.3))], SPEC)
    evidence = dict(offline.evidence)
    evidence["eval_sets"] = [{**evidence["eval_sets"][0], "attribution": SHORTCUT}]
    evidence["behaviour_audit"] = AUDIT
    add_gate(owner_engine, seeded.promotion_id, "offline_eval", passed=False,
             evidence=evidence, reasons=SHORTCUT["violations"])
    shadow = decide_shadow([ShadowSample(f"e{i}", 10, 5, 1.0, 1.0 + (-0.1) ** i)
                            for i in range(20)], SPEC)
    add_gate(owner_engine, seeded.promotion_id, "shadow", passed=shadow.passed,
             evidence={**shadow.evidence, "attribution": {**SHORTCUT, "violations": []}},
             reasons=shadow.reasons)
    canary = decide_canary(CanaryObservation(canary=BinomialCounts(400, 390),
                                             production=BinomialCounts(400, 392),
                                             soak_complete=True), SPEC)
    add_gate(owner_engine, seeded.promotion_id, "canary", passed=canary.passed,
             evidence=canary.evidence, reasons=canary.reasons)

    page.set_viewport_size(DESKTOP)
    sign_in(page, base_url, people["auditor"], f"/promotions/{seeded.promotion_id}")
    expect(page.get_by_test_id("verdict-shadow")).to_have_text(
        "Shadow passed: all 3 checks met their bars.")
    expect(page.get_by_test_id("verdict-canary")).to_have_text(
        "Canary passed: all 3 checks met their bars.")
    expect(page.get_by_test_id("verdict-offline_eval")).to_contain_text("Offline eval failed")
    expect(page.get_by_test_id("shaping-only").first).to_contain_text("progress (+0.36)")
    audit = page.get_by_test_id("behaviour-audit")
    expect(audit.locator("tr.signal-flagged")).to_have_count(2)
    expect(audit.locator("tr.signal-flagged").first).to_contain_text("blocking")
    assert body_overflow(page) <= 0
    _shot(page, "gate-pages-1440")

    page.set_viewport_size(PHONE)
    page.reload()
    expect(page.get_by_test_id("behaviour-audit")).to_be_visible()
    assert body_overflow(page) <= 0
    _shot(page, "gate-pages-390")
