"""reasoning-gym tasks (items a generator made) are admitted one by one through the real
AdmissionWorkflow and the tiny model trains on them for two iterations."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine

from execution_loop.environments.registry import (
    builtin_contract_path,
    describe_task,
    generate_tasks,
    load_builtin_contract,
)
from tests.factories import insert, uid
from tests.factories_byo import admit_task, register, train_briefly
from tests.factories_learning import rows
from triloop.config import ServiceName, Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def short_contract(tmp_path: Path) -> Path:
    """The shipped contract with short replies, so the tiny model's turns are quick."""
    text = builtin_contract_path("reasoning_gym").read_text()
    path = tmp_path / "reasoning_gym.yaml"
    path.write_text(text.replace("max_tokens_per_turn: 256", "max_tokens_per_turn: 16"))
    return path


async def test_reasoning_gym_tasks_are_admitted_and_trained_on(
    tmp_path: Path, settings: Settings, owner_engine: Engine,
    role_engine: Callable[[ServiceName], Engine], tiny_dir: Path,
) -> None:
    governance, web = role_engine("governance"), role_engine("web")
    version = register(governance, settings, short_contract(tmp_path), "reasoning_gym")
    [stored] = rows(owner_engine, "SELECT code_hashes, verifier_hash FROM environment_version "
                    "WHERE id = :v", v=version)
    assert "distribution:reasoning-gym" in stored["code_hashes"]  # the package is in the id

    contract = load_builtin_contract("reasoning_gym")
    params = {"dataset": "basic_arithmetic", "count": 2, "seed": 26, "config": {"max_terms": 3}}
    task_ids = []
    for generated in generate_tasks(contract, params):
        content = describe_task(contract, generated.seed, generated.item)
        task_id = uid("task-")
        insert(owner_engine, "task", id=task_id, environment_version_id=version,
               seed=generated.seed, item=generated.item, tags=dict(generated.tags),
               content_digest=content.digest, status="pending", evidence={})
        task_ids.append(task_id)

    for task_id in task_ids:
        admitted = await admit_task(settings, owner_engine, governance, web, task_id)
        assert admitted.status == "admitted", admitted.reasons
        [task] = rows(owner_engine, "SELECT evidence FROM task WHERE id = :t", t=task_id)
        probe = task["evidence"]["probe"]
        assert probe["environment"] == "reasoning_gym" and probe["verifier_ran_out_of_process"]
        assert probe["verifier_hash"] == stored["verifier_hash"]  # the pin, observed
        assert all(probe["reference_results"])  # the item's own answer, played k times
        hacks = {t["hack"]: t for t in probe["reward_hacks"] if t["applicable"]}
        assert set(hacks) == {"empty_answer", "non_answer", "every_candidate_answer"}
        assert not any(t["rewarded"] for t in hacks.values())

    run_id, status = await train_briefly(settings, owner_engine, tiny_dir, task_ids)
    assert status.status in ("completed", "completed_with_alarms")
    assert status.iterations_done == 2
    played = rows(owner_engine, "SELECT task_id, count(*) AS n FROM trajectory "
                  "WHERE run_id = :r GROUP BY task_id", r=run_id)
    assert {p["task_id"] for p in played} <= set(task_ids)
    assert sum(p["n"] for p in played) >= 16
    verdicts = rows(owner_engine, "SELECT DISTINCT outcome->'verifier'->>'dataset' AS dataset "
                    "FROM trajectory WHERE run_id = :r AND status <> 'failed'", r=run_id)
    assert verdicts == [{"dataset": "basic_arithmetic"}]  # judged by its score_answer
    steps = rows(owner_engine, "SELECT trainable_tokens FROM training_step WHERE run_id = :r",
                 r=run_id)
    assert len(steps) == 2
