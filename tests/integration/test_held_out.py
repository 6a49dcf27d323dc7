"""Eval tasks are held out from training by construction, not by convention.

Two tasks are the same when they share an id, or the same environment and seed under any
version; freezing an eval set refuses tasks any run trains on, and the overlap names
each shared task.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import Engine, text
from sqlmodel import Session

from governance_loop.evalsets import EvalSetError, create_eval_set
from tests.factories import insert, make_task, uid
from triloop.config import Settings
from triloop.held_out import overlaps
from triloop.wiring import build_authorizer

pytestmark = pytest.mark.integration


def _environment(engine: Engine) -> str:
    name = uid("world-")
    insert(engine, "environment", name=name, description="", created_by="test")
    return name


def _task(engine: Engine, environment: str, version: int, seed: int) -> str:
    version_id = uid("sha-")
    insert(engine, "environment_version", id=version_id, environment_name=environment,
           version=version, contract={"task": environment}, contract_text="task: x",
           fixture_hashes={}, created_by="test")
    task_id = uid("task-")
    insert(engine, "task", id=task_id, environment_version_id=version_id, seed=seed,
           status="admitted", evidence={})
    return task_id


def test_a_copy_under_a_new_id_or_version_still_overlaps(owner_engine: Engine) -> None:
    world = _environment(owner_engine)
    trained = _task(owner_engine, world, 1, seed=7)
    copy = _task(owner_engine, world, 2, seed=7)  # a re-registered version, same seed
    other_seed = _task(owner_engine, world, 3, seed=8)
    unrelated = make_task(owner_engine)
    with Session(owner_engine) as session:
        found = overlaps(session=session, training=[trained, unrelated],
                         evaluation=[copy, other_seed])
        same_id = overlaps(session=session, training=[unrelated], evaluation=[unrelated])
    assert [o.describe() for o in found] == [
        f"training task {trained} is the same {world} seed 7 as eval task {copy}"]
    assert [o.describe() for o in same_id] == [f"training task {unrelated} is the same task"]


def test_freezing_an_eval_set_refuses_what_a_run_trains_on(
    owner_engine: Engine, role_engine: Callable[[str], Engine], settings: Settings
) -> None:
    world = _environment(owner_engine)
    trained, copy = _task(owner_engine, world, 1, seed=3), _task(owner_engine, world, 2, seed=3)
    insert(owner_engine, "training_run", id=uid("run-"), submitted_by="alice", name="t",
           config={"rollout": {"task_ids": [trained]}}, status="running", iterations_done=0)
    governance = role_engine("governance")
    authorizer = build_authorizer(settings, "governance")
    with pytest.raises(EvalSetError) as refused:
        create_eval_set(engine=governance, authorizer=authorizer, name=uid("es-"),
                        task_ids=[copy], requested_by="gov-admin")
    assert f"training task {trained} is the same {world} seed 3 as eval task {copy}" in str(
        refused.value)
    with Session(owner_engine) as session:  # nothing was stored
        stored = session.execute(text("SELECT count(*) FROM eval_item WHERE task_id = :t"),
                                 {"t": copy}).scalar_one()
    assert stored == 0
    held_out = _task(owner_engine, world, 3, seed=4)
    created = create_eval_set(engine=governance, authorizer=authorizer, name=uid("es-"),
                              task_ids=[held_out], requested_by="gov-admin")
    assert created.content_hash
