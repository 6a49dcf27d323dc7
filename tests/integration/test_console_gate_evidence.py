"""The promotion page reads like an analysis: a verdict in words first, one row per check
(measured, bar, result), only the gate's thresholds, raw JSON behind a toggle; a gate that
waits for production traffic says so."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from sqlalchemy import Engine

from governance_loop.gates.canary import CanaryObservation, decide_canary
from governance_loop.gates.offline_eval import EvalSetResult, decide_offline_eval
from governance_loop.gates.shadow import ShadowSample, decide_shadow
from governance_loop.gates.stats import BinomialCounts, EpisodeStats
from governance_loop.gates.thresholds import ThresholdSpec
from tests.factories_gate_evidence import AUDIT, SHORTCUT, offline_evidence
from tests.factories_web import Person, add_gate, make_promotion
from tests.integration.console_client import console_session

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]

SPEC = ThresholdSpec.from_mapping({"version": "t-9", "min_success_rate": 0.6,
                                   "max_regression_vs_production": 0.05, "min_samples": 50,
                                   "shadow": {"min_samples": 12}})


@pytest_asyncio.fixture(loop_scope="session")
async def console(web_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=web_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


@pytest.mark.asyncio(loop_scope="session")
async def test_a_shadow_gate_starved_of_traffic_reads_as_such(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            status="failed", current_gate="shadow")
    add_gate(owner_engine, seeded.promotion_id, "offline_eval", with_threshold=True)
    starved = decide_shadow([ShadowSample("e1", 3, 3, 1.0, 1.0)], SPEC)
    add_gate(owner_engine, seeded.promotion_id, "shadow", passed=False,
             evidence=starved.evidence)
    await console_session(console, people["operator"])
    page = html.unescape((await console.get(f"/promotions/{seeded.promotion_id}")).text)
    shadow = page.split('data-testid="verdict-shadow"', 1)[1].split('<li class="gate', 1)[0]
    verdict = shadow.split("</p>", 1)[0]
    assert "did not see enough production traffic: 1, needs 12" in verdict
    row = shadow.split("Paired production episodes", 1)[1].split("</tr>", 1)[0]
    assert ">1<" in row and "≥ 12" in row and ">pending<" in row
    assert "<summary>Raw evidence (JSON)</summary>" in shadow
    thresholds = shadow.split("Thresholds for this gate", 1)[1].split("</details>", 1)[0]
    assert "agreement_floor" in thresholds and "min_success_rate" not in thresholds
    # The flattened dump is gone: no dotted evidence keys as table rows.
    assert "reward_delta.estimate" not in page


@pytest.mark.asyncio(loop_scope="session")
async def test_an_open_shadow_gate_says_it_waits_for_production_traffic(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            current_gate="shadow")
    add_gate(owner_engine, seeded.promotion_id, "offline_eval", with_threshold=True)
    await console_session(console, people["auditor"])
    page = html.unescape((await console.get(f"/promotions/{seeded.promotion_id}")).text)
    note = page.split('data-testid="waiting-for-traffic"', 1)[1].split("</p>", 1)[0]
    assert "Waiting for production traffic" in note and "POST /api/episodes" in note


def _gate_block(page: str, gate: str) -> str:
    return page.split(f'data-testid="verdict-{gate}"', 1)[1].split('<li class="gate', 1)[0]


def _rows(block: str) -> list[str]:
    """Each check row's result badge, as the page shows it."""
    return re.findall(r'<tr class="check-(met|unmet|pending)">', block)


@pytest.mark.asyncio(loop_scope="session")
async def test_each_gate_summary_says_what_its_rows_say(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    """The contradictions a new user found (issue 27, item 5), through the real page: real
    gate decisions stored as governance stores them, rendered by the app."""
    spec = ThresholdSpec.from_mapping({
        "version": "t-27", "min_success_rate": 0.0, "max_regression_vs_production": 0.05,
        "max_reward_regression_vs_production": 0.0, "min_samples": 10,
        "shadow": {"min_samples": 12, "max_mean_reward_regression": 0.0},
        "canary": {"min_samples_per_arm": 40, "regression_to_detect": 0.2}})
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            status="failed", current_gate="canary")
    # 5.000005 points down against a 5-point tolerance: failed by the gate (it compares the
    # counts exactly), while the evidence, rounded to -0.05, would read as a pass.
    offline = decide_offline_eval([EvalSetResult(
        "maps", "v1", EpisodeStats(20_000_000, 18_999_999, 0.5, 0.2),
        EpisodeStats(20, 20, 0.5, 0.2))], spec)
    low_agreement = decide_shadow([ShadowSample(f"e{i}", 10, 5, 1.0, 1.0 + (-0.1) ** i)
                                   for i in range(20)], spec)
    canary = decide_canary(CanaryObservation(canary=BinomialCounts(400, 390),
                                             production=BinomialCounts(400, 392),
                                             soak_complete=True), spec)
    assert not offline.passed and low_agreement.passed and canary.passed
    for decision in (offline, low_agreement, canary):
        add_gate(owner_engine, seeded.promotion_id, decision.gate, passed=decision.passed,
                 evidence=decision.evidence, reasons=decision.reasons)
    await console_session(console, people["operator"])
    page = html.unescape((await console.get(f"/promotions/{seeded.promotion_id}")).text)

    shadow = _gate_block(page, "shadow")
    assert shadow.split("</p>", 1)[0].endswith("Shadow passed: all 3 checks met their bars.")
    assert _rows(shadow) == ["met", "met", "met"] and ">not met<" not in shadow

    canary_block = _gate_block(page, "canary")
    assert "Canary passed: all 3 checks met their bars." in canary_block.split("</p>", 1)[0]
    assert len(_rows(canary_block)) == 3
    assert "Success rate, canary vs production:" in canary_block  # context, beside the table

    offline_block = _gate_block(page, "offline_eval")
    assert "Offline eval failed: 1 of 5 checks did not meet its bar: maps: success rate vs " \
        "production" in offline_block.split("</p>", 1)[0]
    assert _rows(offline_block).count("unmet") == 1
    row = offline_block.split('<th scope="row">maps: success rate vs production', 1)[1]
    row = row.split("</tr>", 1)[0]
    assert ">not met<" in row

    assert "≥ -0<" not in page and "≥ -0.0" not in page and "≥ 0<" in page


@pytest.mark.asyncio(loop_scope="session")
async def test_attribution_and_the_shortcut_audit_render_under_offline_eval(
    console: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            status="failed", current_gate="offline_eval")
    evidence = offline_evidence(eval_set={"attribution": SHORTCUT,
                                          "violations": SHORTCUT["violations"]},
                                behaviour_audit=AUDIT)
    add_gate(owner_engine, seeded.promotion_id, "offline_eval", passed=False,
             evidence={**evidence, "thresholds": {"min_samples": 64,
                                                  "attribution": {"min_task_share": 0.5}}},
             reasons=SHORTCUT["violations"])
    await console_session(console, people["auditor"])
    page = html.unescape((await console.get(f"/promotions/{seeded.promotion_id}")).text)
    block = _gate_block(page, "offline_eval")
    terms = block.split('data-testid="attribution"', 1)[1].split("</section>", 1)[0]
    assert "The gain is from shaping terms only:</strong> progress (+0.36), valid_action " \
        "(+0.02)" in terms
    assert '<tr class="term-shaping term-shortcut"><th scope="row"><code>progress</code>' in terms
    assert '<tr class="term-task"><th scope="row"><code>success</code>' in terms
    audit = block.split('data-testid="behaviour-audit"', 1)[1].split("</section>", 1)[0]
    assert "2 of 3 signals flagged, 1 of them blocking." in audit
    flagged = audit.split('data-signal="action_format/invalid_rate"', 1)[0].rsplit("<tr", 1)[1]
    assert "signal-flagged" in flagged
    row = audit.split('data-signal="action_format/invalid_rate"', 1)[1].split("</tr>", 1)[0]
    assert ">flagged<" in row and ">blocking<" in row
    calm = audit.split('data-signal="length/mean_turns"', 1)[0].rsplit("<tr", 1)[1]
    assert "signal-flagged" not in calm
    # The share row is a check like any other, and the summary counts it.
    assert "share of the reward gain from the task term" in block
    assert "Offline eval failed: 2 of 4 checks" in block.split("</p>", 1)[0]
