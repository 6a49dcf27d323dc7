"""A training run with a shared artifact store: the learner publishes each checkpoint there,
and the execution worker serves it by id from the store (every file verified)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError
from temporalio.client import Client

from learning_loop.store import lineage
from learning_loop.tiny_model import create_tiny_model
from tests.factories_learning import (
    frozen_lake_tasks,
    loops_running,
    make_run,
    make_user,
    queue_settings,
    rows,
    run_config,
    start_run,
)
from triloop.artifacts import LocalArtifactStore, manifest_digest_of, materialize
from triloop.config import Settings
from triloop.weights import safetensors_digest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_learning_fixtures"]


async def test_checkpoints_travel_through_the_shared_store(
    client: Client, settings: Settings, owner_engine: Engine, tmp_path: Path,
) -> None:
    # A base of its own: a checkpoint id is its weights' digest, so the session's shared tiny
    # model would be one row for every test, published here and local everywhere else.
    tiny_model_dir = create_tiny_model(tmp_path / "base", seed=4242)
    shared = tmp_path / "shared-bucket"  # a folder every machine mounts (file:// store)
    own = queue_settings(settings).model_copy(update={"artifact_url": shared.as_uri()})
    alice = make_user(owner_engine)
    tasks = frozen_lake_tasks(owner_engine, [1, 2])
    config = run_config(tiny_model_dir, tasks, schedule={"iterations": 3, "propose_every": 3})
    run_id = make_run(owner_engine, config, alice)
    async with loops_running(client, own):
        handle = await start_run(client, own, run_id, config, alice)
        result = await asyncio.wait_for(handle.result(), 300)
    assert result.iterations_done == 3

    chain = lineage(engine=owner_engine, checkpoint_id=result.latest_checkpoint_id or "")
    store = LocalArtifactStore(shared)
    for checkpoint in chain:  # base and children: recorded by their place in the store
        assert checkpoint.artifact_uri.startswith("artifact://sha256/")
        copy = materialize(store, checkpoint.artifact_uri, tmp_path / "elsewhere", checkpoint.id)
        assert safetensors_digest(copy) == checkpoint.id
    # Iteration 3's rollout ran on iteration 1's checkpoint, which the execution worker
    # could read only through the store.
    served = rows(owner_engine, "SELECT DISTINCT checkpoint_id FROM trajectory "
                  "WHERE run_id = :r AND batch_id LIKE :b", r=run_id, b=f"{run_id}-3-%")
    assert [r["checkpoint_id"] for r in served] == [chain[1].id]
    cached = own.home / "artifact-cache" / manifest_digest_of(chain[1].artifact_uri)
    assert (cached / chain[1].id).is_dir()


def test_the_learning_role_may_record_only_well_formed_store_uris(
    role_engine: Callable[[str], Engine]
) -> None:
    sql = text("INSERT INTO checkpoint (id, base_model, environment_version_ids, data, "
               "artifact_uri, created_by) VALUES (:i, :i, '{}', '{}', :u, 'learning')")
    learning = role_engine("learning")
    for bad in ("artifact://sha256/../../etc", "artifact://sha256/" + "a" * 64 + "/extra",
                "artifact://elsewhere/" + "a" * 64):
        with pytest.raises(ProgrammingError, match="nor artifact://sha256/<digest>"):
            with learning.begin() as conn:
                conn.execute(sql, {"i": uuid.uuid4().hex * 2, "u": bad})
    with learning.begin() as conn:
        conn.execute(sql, {"i": uuid.uuid4().hex * 2, "u": "artifact://sha256/" + "b" * 64})
