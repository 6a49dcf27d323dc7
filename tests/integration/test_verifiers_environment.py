"""``verifiers`` environments registered, a task with an item admitted, and trained on.

Both shipped examples run through the real path: governance registers each contract (the
verifier hash pinned, the verifiers library one entry of the code hashes), the existing
per-task admission probes a task whose item is a row of the taskset (the reference plays
the row's answer; the rubric judges it in the verifier process), and a training run on the
tiny model plays a single-turn and a multi-turn task for 2 iterations.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from execution_loop.environments import verifiers as verifiers_env
from execution_loop.environments.registry import CONTRACTS_DIR
from execution_loop.environments.verifiers_play import rows as taskset_rows
from tests.factories import insert, uid
from tests.factories_byo import admit, register, train_briefly
from tests.factories_learning import rows
from triloop.config import ServiceName, Settings
from triloop.contracts import load_contract

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ARITHMETIC = CONTRACTS_DIR / "verifiers.yaml"
GUESSING = CONTRACTS_DIR / "verifiers_guess_number.yaml"


def row(contract: Path, ordinal: int) -> dict[str, Any]:
    return taskset_rows(verifiers_env.spec_of(load_contract(contract)), ordinal + 1)[ordinal]


def task_with_item(owner: Engine, version_id: str, ordinal: int, item: dict[str, Any],
                   status: str) -> str:
    """A task whose item is one row, written as the owner (registration's stand-in)."""
    task_id = uid("task-")
    insert(owner, "task", id=task_id, environment_version_id=version_id, seed=ordinal,
           status=status, evidence={}, item=item)
    return task_id


@pytest.mark.timeout(1800)  # every episode's verdict imports verifiers afresh (seconds each)
async def test_verifiers_tasks_are_admitted_and_trained_on(
    settings: Settings, owner_engine: Engine, role_engine: Callable[[ServiceName], Engine],
    tiny_dir: Path,
) -> None:
    governance, web = role_engine("governance"), role_engine("web")
    single = register(governance, settings, ARITHMETIC, "verifiers")
    multi = register(governance, settings, GUESSING, "verifiers_guess_number")
    [stored] = rows(owner_engine, "SELECT code_hashes, verifier_hash FROM environment_version "
                    "WHERE id = :v", v=single)
    assert "distribution:verifiers" in stored["code_hashes"]
    assert "execution_loop.environments.verifiers_play" in stored["code_hashes"]

    # An item of the dataset's own: row 3 of the taskset, under another seed.
    pending = task_with_item(owner_engine, single, 9301, row(ARITHMETIC, 3), "pending")
    admitted = await admit(settings, owner_engine, governance, web, single, seed=9301,
                           task_id=pending, wait_s=900)
    assert admitted.status == "admitted"
    [task] = rows(owner_engine, "SELECT evidence FROM task WHERE id = :t", t=pending)
    probe = task["evidence"]["probe"]
    assert probe["environment"] == "verifiers" and probe["verifier_ran_out_of_process"]
    assert probe["verifier_hash"] == stored["verifier_hash"]
    assert probe["reference_results"] and all(probe["reference_results"])

    guess = task_with_item(owner_engine, multi, 9302, {**row(GUESSING, 0), "answer": "3"},
                           "admitted")
    run_id, status = await train_briefly(
        settings, owner_engine, tiny_dir, [pending, guess], timeout_s=900,
        rollout={"group_size": 2, "groups_per_iteration": 2, "deadline_s": 600})
    assert status.status in ("completed", "completed_with_alarms"), status
    assert status.iterations_done == 2
    played = {p["task_id"]: p for p in rows(
        owner_engine, "SELECT task_id, count(*) AS n, max(num_steps) AS turns FROM trajectory "
        "WHERE run_id = :r GROUP BY task_id", r=run_id)}
    assert set(played) == {pending, guess}
    assert played[pending]["turns"] == 1  # single-turn: one reply ends it
    # The tiny model seldom guesses 3 at once: the environment answers and the game goes on.
    assert played[guess]["turns"] > 1
    steps = rows(owner_engine, "SELECT count(*) AS n FROM training_step WHERE run_id = :r",
                 r=run_id)
    assert steps[0]["n"] == 2
