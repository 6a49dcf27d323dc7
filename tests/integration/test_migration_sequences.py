"""Migration 0018 packs stored steps into one sequence per trajectory, and back.

On a database with trajectories at 0016 (one whose prompts extend, one whose history was
rewritten, one without steps): upgrade, check every turn comes back exactly and every
role keeps its permissions (learning sees training sequences only), downgrade, check
the per-step arrays and the permissions are exactly what they were, upgrade again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.factories import make_task, uid
from triloop.db import engine_for_url
from triloop.devstack.postgres import ensure_database
from triloop.migrate import downgrade, upgrade
from triloop.token_sequence import TokenSequence, TurnOffsets, unpack_turns

pytestmark = pytest.mark.integration

ROLES = ("triloop_execution", "triloop_learning", "triloop_governance", "triloop_web")
PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")
OLD_RELATIONS = ("step", "trajectory", "learning_step")
NEW_RELATIONS = ("trajectory_sequence", "learning_trajectory_sequence")

# trajectory id -> purpose, run, steps (prompt, action, logprobs)
EPISODES: dict[str, tuple[str, str | None, list[tuple[list[int], list[int], list[float]]]]] = {
    "extends": ("training", "run-1", [
        ([1, 2, 3], [4, 5], [-0.5, -0.25]),
        ([1, 2, 3, 4, 5, 6, 7], [8], [-1.5]),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9], [], []),  # an empty action
        ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [11, 12], [-0.125, float("-inf")]),
    ]),
    "rewrites": ("eval", None, [
        ([20, 21], [22], [-0.75]),
        ([20, 30], [31, 32], [-0.5, -0.5]),  # the history was rewritten
    ]),
    "empty": ("training", "run-1", []),
}


@pytest.fixture
def database(database_url: str) -> Iterator[str]:
    name = uid("mig_")
    admin = database_url.replace("+psycopg", "").rsplit("/", 1)[0] + "/postgres"
    ensure_database(admin, name)
    yield database_url.rsplit("/", 1)[0] + f"/{name}"


def _privileges(plain: str, relations: tuple[str, ...]) -> dict[tuple[str, str, str], bool]:
    with psycopg.connect(plain) as conn:
        return {
            (role, rel, priv): bool(conn.execute(
                "SELECT has_table_privilege(%s, %s, %s)", (role, rel, priv)).fetchone()[0])  # type: ignore[index]
            for role in ROLES for rel in relations for priv in PRIVILEGES
        }


def _steps(plain: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(plain) as conn:
        return conn.execute(
            'SELECT trajectory_id, "index", prompt_token_ids, action_token_ids, action_mask,'
            ' behaviour_logprobs, observation, feedback, reward, done FROM step'
            ' ORDER BY trajectory_id, "index"').fetchall()


def _seed(url: str) -> None:
    task = make_task(engine_for_url(url))
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        for tid, (purpose, run, steps) in EPISODES.items():
            conn.execute(
                "INSERT INTO trajectory (id, batch_id, run_id, task_id, checkpoint_id, purpose,"
                " group_id, sample_index, policy_version, status, success, total_reward,"
                " num_steps) VALUES (%s, 'b', %s, %s, 'ck', %s, 'g', 0, 0, 'completed', true,"
                " 1.0, %s)", (tid, run, task, purpose, len(steps)))
            for i, (prompt, action, logprobs) in enumerate(steps):
                conn.execute(
                    'INSERT INTO step (trajectory_id, "index", prompt_token_ids, action_token_ids,'
                    " action_mask, behaviour_logprobs, observation, action_text, feedback,"
                    " reward, done) VALUES (%s, %s, %s::int4[], %s::int4[], %s::int2[],"
                    " %s::float8[], %s, 'a', %s::jsonb, %s, %s)",
                    (tid, i, prompt, action, [0] * len(prompt) + [1] * len(action),
                     logprobs, f"obs {i}", f'{{"k": {i}}}', 0.5 * i, i == len(steps) - 1))


def _check_sequences(plain: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(plain) as conn:
        rows = conn.execute("SELECT trajectory_id, token_ids, action_mask, behaviour_logprobs,"
                            " segment_starts FROM trajectory_sequence ORDER BY 1").fetchall()
        offsets = conn.execute(
            'SELECT trajectory_id, prompt_start, observation_start, action_start, action_end'
            ' FROM step ORDER BY trajectory_id, "index"').fetchall()
    assert [r[0] for r in rows] == ["extends", "rewrites"]  # no steps, no sequence
    for tid, ids, mask, logprobs, starts in rows:
        at = [TurnOffsets(*o[1:]) for o in offsets if o[0] == tid]
        turns = unpack_turns(TokenSequence(ids, mask, logprobs, starts), at)
        expected = EPISODES[tid][2]
        assert [(list(t.prompt_token_ids), list(t.action_token_ids), list(t.behaviour_logprobs))
                for t in turns] == expected
    by_id = {r[0]: r for r in rows}
    assert by_id["extends"][1] == list(range(1, 13))  # the opening context stored once
    assert by_id["rewrites"][4] == [0, 3]
    return rows


def test_upgrade_downgrade_upgrade_keeps_every_token_and_permission(database: str) -> None:
    plain = database.replace("+psycopg", "")
    upgrade(database, "0016")
    _seed(database)
    before_steps = _steps(plain)
    before_grants = _privileges(plain, OLD_RELATIONS)

    upgrade(database, "head")
    first = _check_sequences(plain)
    grants = _privileges(plain, OLD_RELATIONS + NEW_RELATIONS)
    for key, allowed in before_grants.items():  # every role keeps what it had
        assert grants[key] == allowed, key
    assert grants[("triloop_execution", "trajectory_sequence", "INSERT")]
    assert not grants[("triloop_execution", "trajectory_sequence", "UPDATE")]
    assert not grants[("triloop_learning", "trajectory_sequence", "SELECT")]
    assert grants[("triloop_learning", "learning_trajectory_sequence", "SELECT")]
    for role in ("triloop_governance", "triloop_web"):
        assert grants[(role, "trajectory_sequence", "SELECT")]
        assert not grants[(role, "trajectory_sequence", "INSERT")]
    with psycopg.connect(plain) as conn:  # learning sees training episodes' sequences only
        conn.execute("SET ROLE triloop_learning")
        seen = conn.execute("SELECT trajectory_id FROM learning_trajectory_sequence").fetchall()
        steps = conn.execute("SELECT DISTINCT trajectory_id FROM learning_step").fetchall()
        assert seen == [("extends",)] and steps == [("extends",)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT 1 FROM trajectory_sequence")

    downgrade(database, "0016")
    assert _steps(plain) == before_steps
    assert _privileges(plain, OLD_RELATIONS) == before_grants

    upgrade(database, "head")
    assert _check_sequences(plain) == first


def test_steps_whose_logprobs_do_not_fit_stop_the_upgrade(database: str) -> None:
    upgrade(database, "0016")
    _seed(database)
    with psycopg.connect(database.replace("+psycopg", "")) as conn:
        conn.execute("UPDATE step SET behaviour_logprobs = '{-1}' WHERE trajectory_id ="
                     " 'rewrites' AND \"index\" = 1")
    with pytest.raises(RuntimeError, match="step 1 of trajectory 'rewrites' has 1 behaviour"):
        upgrade(database, "head")


def _view_columns(plain: str) -> list[str]:
    with psycopg.connect(plain) as conn:
        return [r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = 'learning_step' ORDER BY ordinal_position").fetchall()]


def test_a_step_column_another_revision_added_keeps_its_place(database: str) -> None:
    # As a revision before 0018 might: a new step column, not in learning_step (0017, which
    # recreates the view with ``s.*``, runs before the column is added).
    plain = database.replace("+psycopg", "")
    upgrade(database, "0017")
    with psycopg.connect(plain) as conn:
        conn.execute("ALTER TABLE step ADD COLUMN other_revision_note int")
    upgrade(database, "head")
    columns = _view_columns(plain)
    assert "other_revision_note" not in columns and "prompt_token_ids" not in columns
    assert {"prompt_start", "observation_start", "action_start", "action_end"} <= set(columns)
    downgrade(database, "0017")
    assert "prompt_token_ids" in _view_columns(plain)
    with psycopg.connect(plain) as conn:  # that revision's own downgrade still works
        conn.execute("ALTER TABLE step DROP COLUMN other_revision_note")
