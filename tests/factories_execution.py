"""Rows the execution-loop tests need: built-in environment versions, tasks, checkpoints.

Inserted as the owner (set-up only). Registering the same built-in contract twice
returns the same version, as governance's registration does.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from execution_loop.inference.base import FINISH_STOP, Generation
from tests.factories import uid
from triloop.episode_plan import batch_plan
from triloop.workflow_api import RolloutBatchInput


def _insert_once(engine: Engine, table: str, conflict: str, **values: Any) -> None:
    columns = ", ".join(values)
    params = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in values.items()}
    placeholders = ", ".join(f":{k}" for k in values)
    with engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {table} ({columns}) VALUES ({placeholders}) "
                f"ON CONFLICT ({conflict}) DO NOTHING"
            ),
            params,
        )


def register_contract(
    engine: Engine, contract_text: str, *, base_dir: Path, name: str | None = None
) -> str:
    """An environment version for a contract document; returns its id (sha256)."""
    from triloop.contracts import contract_id, fixture_hashes, parse_contract_text

    contract = parse_contract_text(contract_text, base_dir=base_dir)
    hashes = fixture_hashes(contract, base_dir)
    version_id = contract_id(contract, hashes)
    env_name = name or contract.task
    _insert_once(engine, "environment", "name", name=env_name, description="", created_by="test")
    with engine.connect() as conn:
        existing = conn.execute(
            text("SELECT id FROM environment_version WHERE id = :i"), {"i": version_id}
        ).first()
        number = conn.execute(
            text("SELECT count(*) FROM environment_version WHERE environment_name = :n"),
            {"n": env_name},
        ).scalar_one()
    if existing is None:
        _insert_once(
            engine, "environment_version", "id", id=version_id, environment_name=env_name,
            version=int(number) + 1, contract=contract.model_dump(mode="json"),
            contract_text=contract_text, fixture_hashes=hashes, created_by="test",
        )
    return version_id


def register_builtin(engine: Engine, name: str) -> str:
    """The shipped contract of a built-in environment as a version; returns its id."""
    from execution_loop.environments.registry import CONTRACTS_DIR, builtin_contract_path

    path = builtin_contract_path(name)
    return register_contract(engine, path.read_text(encoding="utf-8"), base_dir=CONTRACTS_DIR)


def make_task_on(engine: Engine, version_id: str, seed: int, status: str = "admitted") -> str:
    """A task on a version (reused if that version and seed exist); returns its id."""
    _insert_once(
        # The unique index of migration 0026: a task is its version, seed and item.
        engine, "task", "environment_version_id, seed, md5(coalesce(item::text, ''))",
        id=uid("task-"),
        environment_version_id=version_id, seed=seed, status=status, evidence={},
    )
    with engine.connect() as conn:
        task_id, stored = conn.execute(
            text("SELECT id, status FROM task WHERE environment_version_id = :v AND seed = :s "
                 "AND item IS NULL"),
            {"v": version_id, "s": seed},
        ).one()
    # Tasks are shared rows: two tests wanting the same seed in different states collide.
    assert stored == status, (
        f"task seed {seed} already exists as {stored}, not {status}: pick another seed")
    return str(task_id)


def make_builtin_task(engine: Engine, name: str, seed: int) -> str:
    """A task on a built-in environment's shipped contract."""
    return make_task_on(engine, register_builtin(engine, name), seed)


def register_checkpoint_dir(
    engine: Engine, model_dir: Path, checkpoint_id: str | None = None
) -> str:
    """A checkpoint row whose artifact_uri is a local model directory; returns its id.

    The id is the sha256 of the directory's weights, as the learning loop computes it
    (the execution loop refuses to serve weights that do not match their id).
    """
    from triloop.weights import safetensors_digest

    ckpt = checkpoint_id or safetensors_digest(model_dir)
    stored = model_dir if checkpoint_id else content_addressed(model_dir, ckpt)
    # A root as the learner registers it (``learning_loop.store.register_root``): its own
    # base, so a training run that later starts from these weights finds the same row.
    _insert_once(
        engine, "checkpoint", "id", id=ckpt, base_model="tiny" if checkpoint_id else ckpt,
        artifact_uri=stored.resolve().as_uri(), created_by="learning", data={},
    )
    return ckpt


def content_addressed(model_dir: Path, checkpoint_id: str) -> Path:
    """The model saved as the learning loop saves a checkpoint: a directory named by its
    digest, with trainer state. A checkpoint id names the same weights in every test, so
    whichever module registers it first must leave a row the learner can train from too
    (it refuses a directory whose name is not its weights' digest)."""

    import torch

    from learning_loop.checkpoints import CheckpointError
    from learning_loop.iteration import load_model, save_servable

    target = model_dir.parent / "checkpoints"
    if (target / checkpoint_id).is_dir():
        return target / checkpoint_id
    try:
        model = load_model(model_dir, torch.device("cpu"))
    except CheckpointError:  # a serving-only variant (an extra tensor): no learner trains
        return model_dir  # from it, and tests that swap its files must reach the row's copy
    ref = save_servable(target, model, model_dir, data_cursor={}, metadata={"source": "tests"})
    assert ref.id == checkpoint_id, (ref.id, checkpoint_id)
    return ref.path


def weights_variant(model_dir: Path, into: Path) -> Path:
    """A copy of a model directory plus one unused tensor: the same model, a checkpoint id of
    its own (tests that need several checkpoints serving alike)."""
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    copy = into / uid("variant-")
    shutil.copytree(model_dir, copy)
    weights = copy / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["triloop_test_variant"] = np.frombuffer(uuid.uuid4().bytes, dtype=np.uint8).copy()
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return copy


def register_variant(engine: Engine, model_dir: Path, into: Path) -> str:
    """A checkpoint of its own that serves exactly like ``model_dir``; returns its id."""
    return register_checkpoint_dir(engine, weights_variant(model_dir, into))


def set_routing(engine: Engine, slot: str, checkpoint_id: str | None, share: float = 0.0) -> None:
    """Write a routing slot as governance would (owner connection, set-up only)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO routing (slot, checkpoint_id, share, updated_by, updated_at) "
                "VALUES (:s, :c, :sh, 'test', now()) ON CONFLICT (slot) DO UPDATE "
                "SET checkpoint_id = :c, share = :sh, updated_at = now()"
            ),
            {"s": slot, "c": checkpoint_id, "sh": share},
        )


def request_batch(engine: Engine, batch: RolloutBatchInput) -> RolloutBatchInput:
    """The batch's ``rollout_batch`` row and its planned episodes, as its requester (or for
    learning, the Nexus handler) would have recorded it.

    Tests that start a rollout workflow directly need it: the database refuses the
    execution role's trajectories in a batch nobody asked for.
    """
    requested_by = {"training": "learning", "production": "web"}.get(batch.purpose, "governance")
    _insert_once(engine, "rollout_batch", "id", id=batch.batch_id, purpose=batch.purpose,
                 checkpoint_id=batch.checkpoint_id, run_id=batch.run_id,
                 requested_by=requested_by, planned_episodes=batch_plan(batch))
    return batch


class StuckPolicy:
    """A policy whose every turn takes far longer than the heartbeat timeout."""

    def __init__(self, checkpoint_id: str, model_dir: Path, delay_s: float) -> None:
        from transformers import AutoTokenizer

        self.checkpoint_id = checkpoint_id
        self._tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._delay_s = delay_s

    def tokenizer(self) -> Any:
        return self._tokenizer

    def generate(self, prompt_token_ids: list[int], *, max_new_tokens: int, temperature: float,
                 seed: int | None, stop_token_ids: Sequence[int] = ()) -> Generation:
        del prompt_token_ids, max_new_tokens, temperature, seed, stop_token_ids
        time.sleep(self._delay_s)
        return Generation(token_ids=[5], logprobs=[-0.1], text="R", finish_reason=FINISH_STOP)


def episode_failures(history: Any) -> list[str]:
    """Why each episode of a rollout failed, from its workflow history: a per-episode
    activity's failure message, or the per-episode reasons a group activity reported
    (``EpisodeGroupResult.failed``, "<ErrorType>: <message>")."""
    from execution_loop.contracts import RUN_EPISODE_GROUP, EpisodeGroupResult
    from triloop.temporal import DATA_CONVERTER

    kinds = {event.event_id: event.activity_task_scheduled_event_attributes.activity_type.name
             for event in history.events
             if event.HasField("activity_task_scheduled_event_attributes")}
    found: list[str] = []
    for event in history.events:
        if event.HasField("activity_task_failed_event_attributes"):
            found.append(event.activity_task_failed_event_attributes.failure.message)
        elif event.HasField("activity_task_completed_event_attributes"):
            done = event.activity_task_completed_event_attributes
            if kinds.get(done.scheduled_event_id) != RUN_EPISODE_GROUP.name:
                continue
            (result,) = DATA_CONVERTER.payload_converter.from_payloads(
                list(done.result.payloads), [EpisodeGroupResult])
            found.extend(result.failed.values())
    return found
