"""Issue 26's Done-when: a reasoning-gym task set of 1,000 generated tasks is registered,
admitted with one decision, split three ways and trained on for two iterations; its eval
split is frozen as an eval set.

Everything is real: the web app (OPA for the operator), Temporal, governance's
TaskSetRegistration (part A) calling the execution loop's describe_tasks, the set's
TaskSetAdmission (part B) probing a seeded sample with the real admission probe (the
reasoning-gym verifier in its own process), and a training run naming the set's train split.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from tests.factories_byo import register, train_briefly
from tests.factories_learning import rows
from tests.factories_web import Person
from triloop.config import ServiceName, Settings

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skip(reason="needs part A's task-set registration (POST /api/task-sets) and "
                            "part B's set admission and runs naming task sets; the "
                            "coordinator removes this skip when merging them"),
]
pytest_plugins = ["tests.factories_web_fixtures"]

COUNT = 1000
GENERATOR = {"dataset": "basic_arithmetic", "count": COUNT, "seed": 26,
             "config": {"max_terms": 3}}
SPLIT = {"by": "fraction", "train": 0.8, "eval": 0.1, "traffic": 0.1}


async def _until(probe: Callable[[], Any], what: str, timeout_s: float = 600.0) -> Any:
    """Poll until ``probe()`` returns something truthy (the workflows run meanwhile)."""
    for _ in range(int(timeout_s / 0.5)):
        found = await probe()
        if found:
            return found
        await asyncio.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_thousand_reasoning_gym_tasks_registered_admitted_split_and_trained_on(
    api: httpx.AsyncClient, people: dict[str, Person], settings: Settings,
    owner_engine: Engine, role_engine: Callable[[ServiceName], Engine], tiny_dir: Path,
) -> None:
    from execution_loop.environments.registry import builtin_contract_path

    operator, engineer = people["operator"], people["engineer"]
    version = register(role_engine("governance"), settings,
                       builtin_contract_path("reasoning_gym"), "reasoning_gym")

    # Registered from the generator: 1,000 tasks, each described (digest and tags).
    created = await api.post("/api/task-sets", headers=operator.headers, json={
        "name": "arithmetic-1k", "environment": version, "generator": GENERATOR,
        "split": SPLIT, "tags": {"source": "reasoning-gym"}, "comment": "issue 26"})
    assert created.status_code == 201, created.text
    task_set_id = created.json()["id"]
    members = rows(owner_engine, "SELECT m.split, t.tags, t.content_digest FROM "
                   "task_set_member m JOIN task t ON t.id = m.task_id "
                   "WHERE m.task_set_id = :s", s=task_set_id)
    assert len(members) == COUNT
    assert len({m["content_digest"] for m in members}) == COUNT
    splits = {split: sum(m["split"] == split for m in members)
              for split in ("train", "eval", "traffic")}
    assert all(splits.values()), splits  # three ways
    assert all(m["tags"]["capability"] == "basic_arithmetic" and
               m["tags"]["domain"] == "arithmetic" and
               m["tags"]["source"] == "reasoning-gym" for m in members)

    # Admitted as one unit: a sample probed for real, then one decision.
    async def assessed() -> dict[str, Any] | None:
        shown = (await api.get(f"/api/task-sets/{task_set_id}",
                               headers=operator.headers)).json()
        return shown if shown.get("evidence", {}).get("sample") else None

    shown = await _until(assessed, "the set's assessment")
    assert 0 < len(shown["evidence"]["sample"]) < COUNT
    decided = await api.post(f"/api/task-sets/{task_set_id}/admission",
                             headers=operator.headers,
                             json={"decision": "approve", "comment": "sample checked"})
    assert decided.status_code == 200, decided.text
    statuses = rows(owner_engine, "SELECT DISTINCT t.status FROM task_set_member m "
                    "JOIN task t ON t.id = m.task_id WHERE m.task_set_id = :s", s=task_set_id)
    assert statuses == [{"status": "admitted"}]

    # The eval split frozen as an eval set.
    frozen = await api.post("/api/eval-sets", headers=operator.headers, json={
        "name": "arithmetic-1k-eval", "from_task_set": task_set_id, "split": "eval"})
    assert frozen.status_code in (200, 201), frozen.text

    # Trained on the train split for two iterations.
    train = [r["task_id"] for r in rows(
        owner_engine, "SELECT task_id FROM task_set_member WHERE task_set_id = :s "
        "AND split = 'train' ORDER BY ordinal", s=task_set_id)]
    del engineer  # the run's submitter is made by train_briefly
    run_id, status = await train_briefly(settings, owner_engine, tiny_dir, train)
    assert status.iterations_done == 2
    played = rows(owner_engine, "SELECT DISTINCT m.split FROM trajectory j JOIN "
                  "task_set_member m ON m.task_id = j.task_id WHERE j.run_id = :r "
                  "AND m.task_set_id = :s", r=run_id, s=task_set_id)
    assert played == [{"split": "train"}]  # never an eval or traffic task
