"""Trajectory storage against the real PostgreSQL and OPA: once per episode, COPY, queries."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import psycopg
import pytest
from sqlalchemy import Engine, func, text
from sqlmodel import Session, col, select

from execution_loop.store import (
    StepRow,
    TrajectoryRow,
    insert_trajectory,
    load_steps,
    load_turn_tokens,
    trajectory_statuses,
    write_trajectories,
    write_trajectory,
)
from learning_loop.batch_metrics import success_series
from learning_loop.trajectory_reader import load_rollout_data
from tests.factories import make_task, uid
from triloop.config import Settings
from triloop.models import Step
from triloop.policy import Authorizer, PolicyDenied
from triloop.token_sequence import SequenceLayoutError
from triloop.wiring import build_authorizer

pytestmark = pytest.mark.integration


@pytest.fixture
def engine(role_engine: Callable[[str], Engine]) -> Engine:
    """The execution loop's own database role."""
    return role_engine("execution")


def planned(owner_engine: Engine, *rows: TrajectoryRow) -> None:
    """Batch rows planning exactly these episodes (the database stores no others)."""
    plans: dict[str, dict[str, dict[str, object]]] = {}
    for row in rows:
        plans.setdefault(row.batch_id, {})[row.id] = {"task_id": row.task_id, "seed": 0}
    with owner_engine.begin() as conn:
        for batch_id, plan in plans.items():
            conn.execute(text(
                "INSERT INTO rollout_batch (id, purpose, requested_by, planned_episodes) "
                "VALUES (:b, 'training', 'learning', CAST(:p AS jsonb))"),
                {"b": batch_id, "p": json.dumps(plan)})


@pytest.fixture
def authorizer(settings: Settings) -> Authorizer:
    """The execution service's authorizer on the real OPA."""
    return build_authorizer(settings, "execution")


def count_steps(*, session: Session, trajectory_ids: list[str]) -> dict[str, int]:
    """Stored step rows per trajectory: exactly once, whole."""
    rows = session.exec(
        select(Step.trajectory_id, func.count())
        .where(col(Step.trajectory_id).in_(trajectory_ids))
        .group_by(col(Step.trajectory_id))
    ).all()
    return {row[0]: int(row[1]) for row in rows}


def episode(task_id: str, *, batch_id: str | None = None, run_id: str | None = None,
            checkpoint_id: str = "ckpt", steps: int = 3) -> tuple[TrajectoryRow, list[StepRow]]:
    """A trajectory and its steps with distinctive arrays (a batch of its own by default)."""
    batch_id = batch_id or uid("batch-")
    row = TrajectoryRow(
        id=uid("ep-"), batch_id=batch_id, task_id=task_id, checkpoint_id=checkpoint_id,
        purpose="training", group_id=f"{batch_id}:0", status="completed", run_id=run_id,
        success=True, total_reward=1.5, num_steps=steps, outcome={"verifier": {"ok": True}},
    )
    rows = [
        StepRow(index=i, prompt_token_ids=[1, 2, 3 + i], action_token_ids=[40 + i, 41],
                action_mask=[0, 0, 0, 1, 1], behaviour_logprobs=[-0.25, float("-inf")],
                observation=f"obs {i}\x00", action_text=f"act {i}",
                feedback={"note": "nul\x00byte", "i": i}, reward=0.5 * i, done=i == steps - 1)
        for i in range(steps)
    ]
    return row, rows


def test_write_is_idempotent_and_keeps_arrays_exact(
    engine: Engine, authorizer: Authorizer, owner_engine: Engine
) -> None:
    row, steps = episode(make_task(owner_engine))
    planned(owner_engine, row)
    assert write_trajectory(engine=engine, authorizer=authorizer, trajectory=row, steps=steps)
    assert not write_trajectory(engine=engine, authorizer=authorizer, trajectory=row, steps=steps)

    with Session(engine) as session:
        stored = load_steps(session=session, trajectory_id=row.id)
        turns = load_turn_tokens(session=session, trajectory_id=row.id)
        assert count_steps(session=session, trajectory_ids=[row.id]) == {row.id: 3}
    assert [s.index for s in stored] == [0, 1, 2]
    first = stored[0]
    for turn, step in zip(turns, steps, strict=True):  # sliced out of the one sequence
        assert list(turn.prompt_token_ids) == step.prompt_token_ids
        assert list(turn.action_token_ids) == step.action_token_ids
        assert list(turn.behaviour_logprobs) == [-0.25, float("-inf")]
    # [1, 2, 4] does not extend [1, 2, 3, 40, 41]: each turn opened a segment of its own.
    assert [(s.prompt_start, s.action_start, s.action_end) for s in stored] == [
        (0, 3, 5), (5, 8, 10), (10, 13, 15)]
    assert first.observation == "obs 0\ufffd" and first.feedback["note"] == "nul\ufffdbyte"
    assert stored[2].done and stored[2].reward == 1.0


def test_copy_and_per_row_inserts_store_the_same_rows(
    engine: Engine, owner_engine: Engine
) -> None:
    task = make_task(owner_engine)
    bulk, steps = episode(task)
    plain = TrajectoryRow(**{**bulk.__dict__, "id": uid("ep-")})
    planned(owner_engine, bulk, plain)
    with engine.begin() as conn:
        raw = conn.connection.driver_connection
        with raw.cursor() as cursor:  # type: ignore[union-attr]
            assert insert_trajectory(cursor, bulk, steps, method="copy")
            assert insert_trajectory(cursor, plain, steps, method="insert")
    columns = ("index, prompt_start, observation_start, action_start, action_end, "
               "observation, action_text, feedback, reward, done")
    with engine.connect() as conn:
        read = [
            conn.execute(text(f"SELECT {columns} FROM step WHERE trajectory_id = :t "
                              "ORDER BY index"), {"t": t}).all()
            for t in (bulk.id, plain.id)
        ]
        packed = [
            conn.execute(text("SELECT token_ids, action_mask, behaviour_logprobs, segment_starts"
                              " FROM trajectory_sequence WHERE trajectory_id = :t"),
                         {"t": t}).all()
            for t in (bulk.id, plain.id)
        ]
    assert read[0] == read[1] and len(read[0]) == 3
    assert packed[0] == packed[1] and len(packed[0]) == 1


def test_denied_write_stores_nothing(
    engine: Engine, settings: Settings, owner_engine: Engine
) -> None:
    dead_opa = build_authorizer(settings.model_copy(update={"opa_url": "http://127.0.0.1:9"}),
                                "execution")
    row, steps = episode(make_task(owner_engine))
    planned(owner_engine, row)
    with pytest.raises(PolicyDenied):
        write_trajectory(engine=engine, authorizer=dead_opa, trajectory=row, steps=steps)
    with engine.connect() as conn:
        for table, column in (("trajectory", "id"), ("step", "trajectory_id")):
            count = conn.execute(
                text(f"SELECT count(*) FROM {table} WHERE {column} = :i"), {"i": row.id}
            ).scalar_one()
            assert count == 0


def test_racing_writers_store_one_copy(
    engine: Engine, authorizer: Authorizer, owner_engine: Engine
) -> None:
    row, steps = episode(make_task(owner_engine), steps=50)
    planned(owner_engine, row)
    results: list[bool] = []
    start = threading.Barrier(4)

    def write() -> None:
        start.wait()
        results.append(
            write_trajectory(engine=engine, authorizer=authorizer, trajectory=row, steps=steps)
        )

    threads = [threading.Thread(target=write) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False, False, False, True]
    with Session(engine) as session:
        assert count_steps(session=session, trajectory_ids=[row.id]) == {row.id: 50}



def test_the_learner_reads_back_every_turn_through_its_views(
    engine: Engine, authorizer: Authorizer, owner_engine: Engine,
    role_engine: Callable[[str], Engine],
) -> None:
    run_id = uid("run-")
    row, _ = episode(make_task(owner_engine), run_id=run_id, steps=3)
    planned(owner_engine, row)
    prompts = [[1, 2, 3], [1, 2, 3, 40, 41, 5], [1, 2, 3, 40, 41, 5, 42, 6, 7]]
    actions = [[40, 41], [42], [43, 44]]
    steps = [StepRow(i, p, a, [], [-0.5] * len(a), "o", "a", {}, 0.25, i == 2)
             for i, (p, a) in enumerate(zip(prompts, actions, strict=True))]
    assert write_trajectory(engine=engine, authorizer=authorizer, trajectory=row, steps=steps)
    with engine.connect() as conn:
        tokens = conn.execute(text("SELECT token_ids FROM trajectory_sequence"
                                   " WHERE trajectory_id = :t"), {"t": row.id}).scalar_one()
    assert tokens == [1, 2, 3, 40, 41, 5, 42, 6, 7, 43, 44]  # the opening context once

    data = load_rollout_data(engine=role_engine("learning"), run_id=run_id,
                             batch_ids=[row.batch_id])
    turns = [s for s in data.steps if s.action_token_ids]
    assert [list(s.prompt_token_ids) for s in turns] == prompts
    assert [list(s.action_token_ids) for s in turns] == actions
    assert data.lengths == [5]


def test_stored_task_success_reaches_the_learners_success_rate(
    engine: Engine, authorizer: Authorizer, owner_engine: Engine,
    role_engine: Callable[[str], Engine],
) -> None:
    run_id, batch = uid("run-"), uid("success-batch-")
    task = make_task(owner_engine)
    group = [episode(task, batch_id=batch, run_id=run_id, steps=2) for _ in range(4)]
    # A failure with more shaped reward than the success: the rate counts the verdict only.
    rows = [TrajectoryRow(**{**row.__dict__, "success": i == 0, "total_reward": 0.1 + 0.3 * i})
            for i, (row, _) in enumerate(group)]
    planned(owner_engine, *rows)
    for row, (_, steps) in zip(rows, group, strict=True):
        assert write_trajectory(engine=engine, authorizer=authorizer, trajectory=row,
                                steps=steps)
    data = load_rollout_data(engine=role_engine("learning"), run_id=run_id, batch_ids=[batch],
                             task_environments={task: "frozen_lake"})
    assert sorted(r.success for r in data.returns) == [False, False, False, True]
    assert success_series(data.returns) == {"success/rate": 0.25, f"success/task/{task}": 0.25,
                                            "success/env/frozen_lake": 0.25}


def test_turns_that_cannot_be_laid_out_store_nothing(
    engine: Engine, authorizer: Authorizer, owner_engine: Engine
) -> None:
    row, steps = episode(make_task(owner_engine))
    planned(owner_engine, row)
    steps[1] = StepRow(**{**steps[1].__dict__, "behaviour_logprobs": [-0.5]})  # 1 for 2 ids
    with pytest.raises(SequenceLayoutError, match="turn 1: 1 behaviour logprobs"):
        write_trajectory(engine=engine, authorizer=authorizer, trajectory=row, steps=steps)
    assert trajectory_statuses(engine=engine, ids=[row.id]) == {}


def test_a_group_is_decided_once_and_stored_once(
    engine: Engine, authorizer: Authorizer, owner_engine: Engine,
) -> None:
    batch = uid("group-batch-")
    task = make_task(owner_engine)
    group = [episode(task, batch_id=batch, steps=n) for n in (1, 2, 3)]
    planned(owner_engine, *(row for row, _ in group))
    # One of them was stored already (an earlier attempt): it is neither decided nor written.
    assert write_trajectory(engine=engine, authorizer=authorizer, trajectory=group[0][0],
                            steps=group[0][1])
    first = write_trajectories(engine=engine, authorizer=authorizer, episodes=group)
    assert first.written == {group[1][0].id, group[2][0].id}
    assert first.present == {group[0][0].id: "completed"} and first.denied == {}
    again = write_trajectories(engine=engine, authorizer=authorizer, episodes=group)
    assert again.written == set() and set(again.present) == {row.id for row, _ in group}

    with Session(engine) as session:
        assert count_steps(session=session, trajectory_ids=[r.id for r, _ in group]) == {
            group[0][0].id: 1, group[1][0].id: 2, group[2][0].id: 3}
    with owner_engine.connect() as conn:
        decisions = conn.execute(text(
            "SELECT resource FROM audit_event WHERE action = 'create' AND "
            "resource->'attrs'->>'batch_id' = :b ORDER BY seq"), {"b": batch}).scalars().all()
    assert len(decisions) == 2  # the lone episode's own, then one for the other two
    assert decisions[1]["id"] == f"{batch}:0"
    assert decisions[1]["attrs"]["trajectory_ids"] == [group[1][0].id, group[2][0].id]
    assert decisions[1]["attrs"]["num_steps"] == [2, 3]


def test_a_denied_group_stores_none_of_its_episodes(
    engine: Engine, settings: Settings, owner_engine: Engine,
) -> None:
    dead_opa = build_authorizer(settings.model_copy(update={"opa_url": "http://127.0.0.1:9"}),
                                "execution")
    task = make_task(owner_engine)
    group = [episode(task, batch_id=uid("batch-")) for _ in range(2)]
    planned(owner_engine, *(row for row, _ in group))
    result = write_trajectories(engine=engine, authorizer=dead_opa, episodes=group)
    assert result.written == set() and set(result.denied) == {row.id for row, _ in group}
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT count(*) FROM trajectory WHERE id = ANY(:i)"),
                              {"i": [row.id for row, _ in group]}).scalar_one()
    assert stored == 0


def test_the_database_refuses_a_group_in_a_batch_nobody_asked_for(
    engine: Engine, authorizer: Authorizer, owner_engine: Engine,
) -> None:
    task = make_task(owner_engine)
    group = [episode(task, batch_id=uid("unrequested-")) for _ in range(2)]
    with pytest.raises(psycopg.Error):
        write_trajectories(engine=engine, authorizer=authorizer, episodes=group)
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT count(*) FROM trajectory WHERE id = ANY(:i)"),
                              {"i": [row.id for row, _ in group]}).scalar_one()
    assert stored == 0  # one transaction: neither row
