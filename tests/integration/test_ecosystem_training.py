"""Gymnasium's toy-text games and an OpenEnv server: registered, admitted task by task
through the existing per-task admission, and trained on for 2 iterations."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.environment_games import write_game_contract
from tests.environment_services import openenv_server, write_openenv_contract
from tests.factories_byo import admit, register, train_briefly
from tests.factories_learning import rows
from triloop.config import ServiceName, Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# seed per game: Blackjack's seed 2 deals a hand that can be won (seed 0's cannot)
SEEDS = {"FrozenLake-v1": 5, "Taxi-v4": 1, "Blackjack-v1": 2}


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with openenv_server() as url:
        yield url


def _trained(owner: Engine, run_id: str) -> tuple[int, list[dict[str, object]]]:
    played = rows(owner, "SELECT count(*) AS n FROM trajectory WHERE run_id = :r", r=run_id)
    steps = rows(owner, "SELECT trainable_tokens FROM training_step WHERE run_id = :r",
                 r=run_id)
    return int(played[0]["n"]), steps


async def test_each_gymnasium_game_is_admitted_and_trained_on(
    tmp_path: Path, settings: Settings, owner_engine: Engine,
    role_engine: Callable[[ServiceName], Engine], tiny_dir: Path,
) -> None:
    governance, web = role_engine("governance"), role_engine("web")
    tasks = []
    for game, seed in SEEDS.items():
        name = f"gymnasium_{game.split('-')[0].lower()}"
        version = register(governance, settings, write_game_contract(tmp_path, game), name)
        [stored] = rows(owner_engine, "SELECT code_hashes, verifier_hash FROM "
                        "environment_version WHERE id = :v", v=version)
        assert "distribution:gymnasium" in stored["code_hashes"]  # its code is the version's
        admitted = await admit(settings, owner_engine, governance, web, version, seed=seed)
        assert admitted.status == "admitted", game
        [task] = rows(owner_engine, "SELECT id, evidence, item IS NULL AS seed_alone FROM task "
                      "WHERE id = :t", t=admitted.task_id)
        assert task["seed_alone"]  # a single task has no item: SQL NULL, not {}
        probe = task["evidence"]["probe"]
        assert probe["verifier_ran_out_of_process"] and all(probe["reference_results"])
        assert probe["verifier_hash"] == stored["verifier_hash"]
        tasks.append(task["id"])

    run_id, status = await train_briefly(settings, owner_engine, tiny_dir, tasks[:2])
    assert status.status in ("completed", "completed_with_alarms")
    assert status.iterations_done == 2
    played, steps = _trained(owner_engine, run_id)
    assert played >= 16 and len(steps) == 2


async def test_an_openenv_server_is_admitted_and_trained_on(
    server_url: str, tmp_path: Path, settings: Settings, owner_engine: Engine,
    role_engine: Callable[[ServiceName], Engine], tiny_dir: Path,
) -> None:
    governance, web = role_engine("governance"), role_engine("web")
    version = register(governance, settings, write_openenv_contract(tmp_path, server_url),
                       "openenv_countdown")
    [stored] = rows(owner_engine, "SELECT code_hashes, verifier_hash FROM environment_version "
                    "WHERE id = :v", v=version)
    assert "execution_loop.environments.openenv" in stored["code_hashes"]
    admitted = await admit(settings, owner_engine, governance, web, version, seed=1)
    assert admitted.status == "admitted"
    [task] = rows(owner_engine, "SELECT id, evidence FROM task WHERE id = :t", t=admitted.task_id)
    assert task["evidence"]["probe"]["verifier_ran_out_of_process"]

    run_id, status = await train_briefly(settings, owner_engine, tiny_dir, [task["id"]])
    assert status.status in ("completed", "completed_with_alarms")
    assert status.iterations_done == 2
    played, steps = _trained(owner_engine, run_id)
    assert played >= 8 and len(steps) == 2
