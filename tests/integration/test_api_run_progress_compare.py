"""A run's progress and proposals, the runs list's last results and filters, and runs
compared, through the API and `triloop train` (real PostgreSQL and OPA; the rows are what
the learning loop and governance write)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import typer
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from tests.factories import insert, uid
from tests.factories_web import (
    Person,
    assert_problem,
    console_cookie,
    make_promotion,
    make_user,
)
from web.auth import SESSION_COOKIE

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures", "tests.integration.cli_app"]

STARVED = {"trajectories": 4, "skipped": 10, "truncated_excluded": 2, "groups": 2}


def _config(name: str, *, group_size: int = 8, iterations: int = 4) -> dict[str, object]:
    return {"name": name, "model": {"base": "/models/tiny-local"},
            "rollout": {"task_ids": ["t-a"], "group_size": group_size, "deadline_s": 600.0},
            "schedule": {"iterations": iterations, "propose_every": 2, "seed": 0}}


def _run(engine: Engine, submitted_by: str, *, name: str, status: str = "running",
         iterations_done: int = 0, group_size: int = 8, run_id: str | None = None) -> str:
    run_id = run_id or uid("run-")
    insert(engine, "training_run", id=run_id, submitted_by=submitted_by, name=name,
           config=_config(name, group_size=group_size), status=status,
           iterations_done=iterations_done)
    return run_id


def _steps(engine: Engine, run_id: str, rewards: list[float], *, success: float = 0.5,
           batch: dict[str, int] | None = None) -> None:
    """Iterations 1.. with these mean rewards, a success rate, and each batch's counts."""
    for i, reward in enumerate(rewards, start=1):
        insert(engine, "training_step", run_id=run_id, iteration=i, reward_mean=reward,
               entropy=1.5 - i * 0.1, alarms=[], length_stats={},
               metrics={"batch": batch or {"trajectories": 16, "skipped": 0,
                                           "truncated_excluded": 0},
                        "series": {"success/rate": success}})


def _adopt(engine: Engine, run_id: str, name: str, status: str, done: int) -> None:
    """Give a seeded promotion's run a schedule, a status and iterations done."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE training_run SET config = CAST(:c AS jsonb), status = :s,"
                          " iterations_done = :n, name = :name WHERE id = :i"),
                     {"c": json.dumps(_config(name)), "s": status, "n": done,
                      "name": name, "i": run_id})


async def test_a_run_says_n_of_n_its_estimate_starved_rollouts_and_what_it_proposed(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    engineer = people["engineer"]
    seeded = make_promotion(owner_engine, submitted_by=engineer.name, current_gate="shadow")
    _adopt(owner_engine, seeded.run_id, uid("progress-"), "running", 2)
    _steps(owner_engine, seeded.run_id, [0.1, 0.2], batch=STARVED)

    detail = (await api.get(f"/api/runs/{seeded.run_id}", headers=engineer.headers)).json()
    progress = detail["progress"]
    assert (progress["iteration"], progress["iterations"]) == (2, 4)
    assert progress["summary"].startswith("iteration 2 of 4, elapsed ")
    assert progress["starved"]["kind"] == "lost_episodes"
    assert progress["starved"]["message"].startswith(
        "rollouts starved: iteration 2 learnt from 4 of 16 episodes")
    assert detail["proposed"] == [{
        "checkpoint_id": seeded.checkpoint_id, "iteration": 10,
        "proposed_at": detail["proposed"][0]["proposed_at"],
        "promotion_id": seeded.promotion_id, "promotion_status": "open",
        "current_gate": "shadow"}]

    polled = (await api.get(f"/api/runs/{seeded.run_id}/metrics?after=1",
                            headers=engineer.headers)).json()
    assert [p["iteration"] for p in polled["metrics"]] == [2]
    assert polled["progress"]["iterations"] == 4 and polled["progress"]["starved"]
    assert polled["proposed"][0]["promotion_id"] == seeded.promotion_id


async def test_the_runs_list_has_last_reward_success_n_of_n_and_its_filters(
    api: httpx.AsyncClient, owner_engine: Engine,
) -> None:
    submitter = make_user(owner_engine, "ml_engineer")
    done = _run(owner_engine, submitter.name, name="listed", status="completed",
                iterations_done=3)
    _steps(owner_engine, done, [0.1, 0.3, 0.45], success=0.75)
    fresh = _run(owner_engine, submitter.name, name="fresh", status="running")
    page = (await api.get(f"/api/runs?submitted_by={submitter.name}",
                          headers=submitter.headers)).json()
    by_id = {r["id"]: r for r in page["items"]}
    assert set(by_id) == {done, fresh}
    assert (by_id[done]["last_reward"], by_id[done]["last_success"]) == (0.45, 0.75)
    assert (by_id[done]["iterations_done"], by_id[done]["iterations"]) == (3, 4)
    assert by_id[fresh]["last_reward"] is None and by_id[fresh]["last_success"] is None
    completed = (await api.get(f"/api/runs?submitted_by={submitter.name}&status=completed",
                               headers=submitter.headers)).json()
    assert [r["id"] for r in completed["items"]] == [done]


async def test_runs_compare_labels_runs_diffs_their_configs_and_carries_their_series(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    ann, bo = make_user(owner_engine, "ml_engineer"), make_user(owner_engine, "ml_engineer")
    a = _run(owner_engine, ann.name, name="sweep", group_size=8, status="completed",
             iterations_done=2)
    b = _run(owner_engine, bo.name, name="sweep", group_size=4, status="completed",
             iterations_done=2)
    c = _run(owner_engine, ann.name, name="", group_size=8, iterations_done=1)
    _steps(owner_engine, a, [0.1, 0.2])
    _steps(owner_engine, b, [0.3, 0.5], success=1.0)
    _steps(owner_engine, c, [0.0])
    response = await api.get(f"/api/runs/compare?ids={a},{b},{c}",
                             headers=people["engineer"].headers)
    assert response.status_code == 200, response.text
    comparison = response.json()
    assert [r["id"] for r in comparison["runs"]] == [a, b, c]
    assert [r["label"] for r in comparison["runs"]] == [
        f"sweep · {a[:8]} ({ann.name})", f"sweep · {b[:8]} ({bo.name})", f"{c[:8]} ({ann.name})"]
    assert [r["last_reward"] for r in comparison["runs"]] == [0.2, 0.5, 0.0]
    assert [len(r["metrics"]) for r in comparison["runs"]] == [2, 2, 1]
    diff = {d["path"]: d["values"] for d in comparison["config_differences"]}
    assert diff == {"name": ["sweep", "sweep", ""], "rollout.group_size": [8, 4, 8]}


async def test_runs_compare_refuses_a_selection_it_cannot_show_and_a_person_without_reads(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    engineer = people["engineer"]
    a = _run(owner_engine, engineer.name, name="one")
    b = _run(owner_engine, engineer.name, name="two")
    one = await api.get(f"/api/runs/compare?ids={a},{a}", headers=engineer.headers)
    assert_problem(one, 422, "compare 2 to 8 different runs; 1 given")
    many = ",".join(uid("r") for _ in range(9))
    assert_problem(await api.get(f"/api/runs/compare?ids={many}", headers=engineer.headers),
                   422, "9 given")
    ghost = uid("run-ghost-")
    missing = await api.get(f"/api/runs/compare?ids={a},{ghost}", headers=engineer.headers)
    assert_problem(missing, 404, ghost)
    absent = await api.get("/api/runs/compare", headers=engineer.headers)
    assert absent.status_code == 422 and "ids" in absent.text
    refused = await api.get(f"/api/runs/compare?ids={a},{b}",
                            headers=people["admin"].headers)
    assert_problem(refused, 403, "training_run")


def test_train_compare_prints_runs_by_label_the_settings_that_differ_and_last_values(
    app_cli: typer.Typer, people: dict[str, Person], owner_engine: Engine,
) -> None:
    engineer = people["engineer"]
    a = _run(owner_engine, engineer.name, name=uid("lr-a-"), group_size=8,
             run_id=uid("cmpa") + "0" * 8)
    b = _run(owner_engine, engineer.name, name=uid("lr-b-"), group_size=2)
    _steps(owner_engine, a, [0.25])
    _steps(owner_engine, b, [0.5])
    result = CliRunner().invoke(app_cli, ["train", "compare", a[:12], b, "--token",
                                          engineer.token])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "RUN.yaml settings that differ:" in out
    row = next(line for line in out.splitlines() if line.startswith("rollout.group_size"))
    assert row.split("\t") == ["rollout.group_size", "8", "2"]
    reward = next(line for line in out.splitlines() if line.startswith("reward (mean)"))
    assert reward.split("\t") == ["reward (mean)", "0.25", "0.5"]
    assert f"/runs/compare?ids={a},{b}" in out
    alone = CliRunner().invoke(app_cli, ["train", "compare", a, "--token", engineer.token])
    assert alone.exit_code == 1 and "compare 2 to 8 different runs" in alone.stderr


def test_show_wait_prints_n_of_n_and_at_the_end_the_candidate_and_its_promotion(
    app_cli: typer.Typer, people: dict[str, Person], owner_engine: Engine,
) -> None:
    engineer = people["engineer"]
    seeded = make_promotion(owner_engine, submitted_by=engineer.name, current_gate="eval")
    _adopt(owner_engine, seeded.run_id, uid("ended-"), "completed", 4)
    _steps(owner_engine, seeded.run_id, [0.1, 0.2, 0.3, 0.4])
    result = CliRunner().invoke(app_cli, ["train", "show", seeded.run_id, "--wait",
                                          "--poll-interval", "0.05", "--token",
                                          engineer.token])
    assert result.exit_code == 0, result.output
    assert f"run {seeded.run_id}: completed, iteration 4 of 4, elapsed " in result.stderr
    assert (f"run {seeded.run_id}: proposed candidate {seeded.checkpoint_id} (iteration 10):"
            f" promotion {seeded.promotion_id}, open at the eval gate; console: "
            f"http://127.0.0.1:8000/promotions/{seeded.promotion_id}") in result.stderr
    # `show` itself says it too, on stdout.
    assert f"proposed candidate {seeded.checkpoint_id}" in result.stdout
    assert "iteration 4 of 4" in result.stdout


async def test_the_console_refuses_a_bogus_status_filter_and_canonicalises_a_selection(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, web_app: Any,
) -> None:
    engineer = people["engineer"]
    cookie = {"Cookie": f"{SESSION_COOKIE}={console_cookie(web_app, engineer)}",
              "Accept": "text/html"}
    bogus = await api.get("/runs?status=bogus", headers=cookie)
    assert bogus.status_code == 422 and "status &#39;bogus&#39; is not a run status" in bogus.text
    assert (await api.get("/runs?status=&submitted_by=", headers=cookie)).status_code == 200
    a = _run(owner_engine, engineer.name, name="picked-a")
    b = _run(owner_engine, engineer.name, name="picked-b")
    picked = await api.get(f"/runs/compare?ids={a}&ids={b}", headers=cookie)
    assert picked.status_code == 303
    assert picked.headers["location"] == f"/runs/compare?ids={a},{b}"
    page = await api.get(f"/runs/compare?ids={a},{b}", headers=cookie)
    assert page.status_code == 200 and "picked-a (" in page.text
    one = await api.get(f"/runs/compare?ids={a}", headers=cookie)
    assert one.status_code == 303 and one.headers["location"] == "/runs"
