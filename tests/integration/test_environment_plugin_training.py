"""An environment defined outside triloop is installed, registered, admitted and trained on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.environment_plugins import install_example, on_path
from tests.factories_byo import admit, register, train_briefly
from tests.factories_learning import rows
from triloop.config import ServiceName, Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[Path]:
    """The example package built from its local source and installed for this test."""
    site = install_example(tmp_path)
    with on_path(site):
        yield site


async def test_an_installed_environment_is_admitted_and_trained_on(
    installed: Path, settings: Settings, owner_engine: Engine,
    role_engine: Callable[[ServiceName], Engine], tiny_dir: Path,
) -> None:
    governance, web = role_engine("governance"), role_engine("web")
    version = register(governance, settings, installed / "letter_count_env" / "contract.yaml",
                       "letter_count")
    [stored] = rows(owner_engine, "SELECT code_hashes, verifier_hash FROM environment_version "
                    "WHERE id = :v", v=version)
    assert "letter_count_env.environment" in stored["code_hashes"]

    admitted = await admit(settings, owner_engine, governance, web, version, seed=5)
    assert admitted.status == "admitted"
    [task] = rows(owner_engine, "SELECT id, evidence FROM task WHERE id = :t", t=admitted.task_id)
    probe = task["evidence"]["probe"]
    assert probe["environment"] == "letter_count" and probe["verifier_ran_out_of_process"]
    assert probe["verifier_hash"] == stored["verifier_hash"]  # the pin, observed

    run_id, status = await train_briefly(settings, owner_engine, tiny_dir, [task["id"]])
    assert status.status in ("completed", "completed_with_alarms")
    assert status.iterations_done == 2
    played = rows(owner_engine, "SELECT count(*) AS n FROM trajectory WHERE run_id = :r "
                  "AND task_id = :t", r=run_id, t=task["id"])
    assert played[0]["n"] >= 16
    recorded = rows(owner_engine, "SELECT DISTINCT outcome->'sandbox'->>'backend' AS backend "
                    "FROM trajectory WHERE run_id = :r", r=run_id)
    assert recorded == [{"backend": "none"}]  # letter_count runs no agent code
    steps = rows(owner_engine, "SELECT trainable_tokens FROM training_step WHERE run_id = :r",
                 r=run_id)
    # Four groups of four: a group whose rewards all match teaches nothing, but with the
    # format reward (about half the tiny model's replies hold a digit) not all four do.
    assert len(steps) == 2 and any(s["trainable_tokens"] > 0 for s in steps)
