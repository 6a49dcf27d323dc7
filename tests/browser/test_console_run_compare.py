"""Comparing runs, and following one, in Chromium.

An engineer narrows the runs list to one submitter, reads each run's id, last reward and
success, ticks three runs and compares them: the address keeps the selection
(``/runs/compare?ids=a,b,c``), the configs' differences are a table with a column per run,
and every chart overlays the three in distinct colours, its legend naming the runs by label,
never by a 32-character id. On a running run's page they read "iteration n of N", the
elapsed time, that its rollouts are starved, and are offered Pause and Cancel but not
Resume; a finished run's page links the candidate it proposed and its promotion.
Screenshots at 1440 and 390 px go to ``test-output/screenshots/``.
"""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import Engine, text

from tests.browser.support import shot, sign_in
from tests.factories import insert, uid
from tests.factories_web import Person, make_promotion, make_user

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_web_fixtures"]

DESKTOP = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}
TASK = "f00dfeed" * 4  # a 32-character task id


def body_overflow(page: Page) -> int:
    """How many CSS pixels the page is wider than the viewport (0 when nothing overflows)."""
    return int(page.evaluate(
        "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
        " - document.documentElement.clientWidth"))


def _config(name: str, *, lr: float, group_size: int) -> dict[str, object]:
    return {"name": name, "model": {"base": "/models/tiny-local"},
            "rollout": {"task_ids": [TASK], "group_size": group_size, "deadline_s": 600.0},
            "optimizer": {"learning_rate": lr},
            "schedule": {"iterations": 6, "propose_every": 3, "seed": 0}}


def _run(engine: Engine, submitter: str, name: str, *, lr: float, group_size: int = 4,
         status: str = "completed", iterations: int = 6, run_id: str | None = None) -> str:
    run_id = run_id or uid("run-")
    insert(engine, "training_run", id=run_id, submitted_by=submitter, name=name,
           config=_config(name, lr=lr, group_size=group_size), status=status,
           iterations_done=iterations)
    return run_id


def _steps(engine: Engine, run_id: str, n: int, slope: float,
           batch: dict[str, int] | None = None) -> None:
    for i in range(1, n + 1):
        insert(engine, "training_step", run_id=run_id, iteration=i, reward_mean=slope * i,
               entropy=2.0 - 0.1 * i, kl=0.01 * i, grad_norm=0.5, alarms=[],
               length_stats={},
               metrics={"batch": batch or {"trajectories": 16, "skipped": 0,
                                           "truncated_excluded": 0},
                        "series": {"success/rate": min(1.0, slope * i),
                                   f"reward/task/{TASK}": slope * i}})


def test_an_engineer_compares_three_runs_from_the_runs_list(
    page: Page, base_url: str, owner_engine: Engine,
) -> None:
    ann = make_user(owner_engine, "ml_engineer")
    tag = uid("")[:6]
    low = _run(owner_engine, ann.name, f"lr-low-{tag}", lr=1e-5)
    mid = _run(owner_engine, ann.name, f"lr-mid-{tag}", lr=1e-4, group_size=8)
    high = _run(owner_engine, ann.name, f"lr-high-{tag}", lr=1e-3)
    for run_id, slope in ((low, 0.02), (mid, 0.1), (high, 0.15)):
        _steps(owner_engine, run_id, 6, slope)
    page.set_viewport_size(DESKTOP)
    sign_in(page, base_url, ann, "/runs")

    page.get_by_label("Submitted by").fill(ann.name)
    page.get_by_label("Status").select_option("completed")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"status=completed"))
    rows = page.locator("#runs-table tbody tr")
    expect(rows).to_have_count(3)
    high_row = page.locator(f"#runs-table tr[data-run-id='{high}']")
    expect(high_row.locator("code.run-id")).to_have_text(high)  # the whole id, to copy
    expect(high_row).to_contain_text("6 of 6")
    expect(high_row).to_contain_text("0.9")  # last reward 0.15 * 6
    expect(high_row).to_contain_text("90%")
    shot(page, "runs-list-filtered-1440")

    for run_id in (low, mid, high):
        page.locator(f"#pick-{run_id}").check()
    page.get_by_role("button", name="Compare selected runs").click()
    # Newest first, as listed; the address is the selection, in one shareable form.
    expect(page).to_have_url(f"{base_url}/runs/compare?ids={high},{mid},{low}")
    expect(page.get_by_role("heading", name="Compare 3 runs")).to_be_visible()
    labels = page.locator("#compared-runs .run-label")
    expect(labels).to_have_text([f"lr-high-{tag} ({ann.name})", f"lr-mid-{tag} ({ann.name})",
                                 f"lr-low-{tag} ({ann.name})"])

    diff = page.locator("#config-diff")
    lr_row = diff.locator("tr[data-path='optimizer.learning_rate']")
    expect(lr_row.locator("td")).to_have_text(["0.001", "0.0001", "1e-05"])
    expect(diff.locator("tr[data-path='rollout.group_size'] td")).to_have_text(["4", "8", "4"])
    expect(diff.locator("tr[data-path='rollout.deadline_s']")).to_have_count(0)  # the same

    charts = page.locator("#charts")
    expect(charts).to_have_attribute("data-drawn", re.compile(r"^[1-9]"))
    reward = page.locator("#chart-reward-mean")
    expect(reward.locator(".u-legend")).to_contain_text(f"lr-mid-{tag} ({ann.name})")
    assert reward.locator(".uplot").get_attribute("data-series") == "3"
    colours = reward.locator(".u-legend .u-series .u-marker").evaluate_all(
        "els => els.map(e => getComputedStyle(e).borderColor)")
    drawn = [c for c in colours if c and c != "rgba(0, 0, 0, 0)"]
    assert len(set(drawn)) >= 3, colours  # three runs, three colours
    legends = page.locator(".u-legend").all_inner_texts()
    assert legends and not any(TASK in text for text in legends)
    per_task = page.locator("#chart-reward-task")  # one task: its lines are the runs'
    expect(per_task.locator(".u-legend")).to_contain_text(f"lr-low-{tag} ({ann.name})")
    expect(per_task.locator(".chart-summary")).not_to_contain_text(TASK)
    shot(page, "runs-compare-three-1440")

    # The address alone brings the comparison back (a shared link, a reload).
    page.goto(f"{base_url}/runs/compare?ids={low},{high},{mid}")
    expect(labels.first).to_have_text(f"lr-low-{tag} ({ann.name})")
    page.set_viewport_size(PHONE)
    page.reload()
    expect(page.locator("#charts")).to_have_attribute("data-drawn", re.compile(r"^[1-9]"))
    assert body_overflow(page) <= 0
    shot(page, "runs-compare-three-390")

    # One run is not a comparison: back to the list, saying why.
    page.goto(f"{base_url}/runs/compare?ids={low}")
    expect(page).to_have_url(f"{base_url}/runs")
    expect(page.locator(".notice[role=status]")).to_contain_text(
        "compare 2 to 8 different runs; 1 given")


def test_a_running_run_shows_progress_starvation_and_no_resume_and_an_ended_one_its_candidate(
    page: Page, base_url: str, owner_engine: Engine, people: dict[str, Person],
) -> None:
    engineer = people["engineer"]
    running = _run(owner_engine, engineer.name, uid("follow-"), lr=1e-4, status="running",
                   iterations=2)
    _steps(owner_engine, running, 2, 0.1,
           batch={"trajectories": 3, "skipped": 9, "truncated_excluded": 4})
    page.set_viewport_size(DESKTOP)
    sign_in(page, base_url, engineer, f"/runs/{running}")
    expect(page.locator("#run-status")).to_contain_text("running")
    expect(page.locator(".status-box")).to_contain_text("iteration 2 of 6")
    expect(page.get_by_test_id("run-progress")).to_contain_text("elapsed ")
    expect(page.get_by_test_id("rollouts-starved")).to_contain_text(
        "rollouts starved: iteration 2 learnt from 3 of 16 episodes")
    controls = page.get_by_role("region", name="Control this run")
    expect(controls.get_by_role("button", name="Pause")).to_be_visible()
    expect(controls.get_by_role("button", name="Cancel")).to_be_visible()
    expect(controls.get_by_role("button", name="Resume")).to_have_count(0)
    shot(page, "run-progress-starved-1440")

    # The learner pauses it: now Resume is offered, and Pause is not.
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE training_run SET status = 'paused' WHERE id = :i"),
                     {"i": running})
    page.reload()
    expect(controls.get_by_role("button", name="Resume")).to_be_visible()
    expect(controls.get_by_role("button", name="Pause")).to_have_count(0)
    expect(page.get_by_test_id("run-progress")).to_contain_text(
        "paused: no estimate until it resumes")

    seeded = make_promotion(owner_engine, submitted_by=engineer.name, current_gate="shadow")
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE training_run SET config = CAST(:c AS jsonb), status ="
                          " 'completed', iterations_done = 6 WHERE id = :i"),
                     {"c": json.dumps(_config("ended", lr=1e-4, group_size=4)),
                      "i": seeded.run_id})
    page.goto(f"{base_url}/runs/{seeded.run_id}")
    proposed = page.get_by_test_id("run-proposed")
    expect(proposed.get_by_role("link", name=seeded.checkpoint_id[:12])).to_have_attribute(
        "href", f"/checkpoints/{seeded.checkpoint_id}/lineage")
    expect(proposed.get_by_role("link", name=seeded.promotion_id[:12])).to_have_attribute(
        "href", f"/promotions/{seeded.promotion_id}")
    expect(proposed).to_contain_text("at the shadow gate")
    expect(page.get_by_role("region", name="Control this run")).to_have_count(0)
    expect(page.locator(".status-box")).to_contain_text("iteration 6 of 6")
    page.set_viewport_size(PHONE)
    page.reload()
    assert body_overflow(page) <= 0
    shot(page, "run-proposed-390")
