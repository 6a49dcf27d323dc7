"""With the OpenAI-compatible backend, a batch makes the inference server load its checkpoint
before the first request, and refuses (audited) a server that serves other weights under it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, text
from temporalio.client import Client

from execution_loop.inference.server import create_app
from execution_loop.serving import backend_factory
from execution_loop.worker import build_worker
from tests.factories_execution import (
    episode_failures,
    make_builtin_task,
    register_checkpoint_dir,
    request_batch,
    weights_variant,
)
from tests.model_servers import serving, serving_app
from triloop.config import Settings
from triloop.temporal import connect
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    ROLLOUT_WORKFLOW,
    RolloutBatchInput,
    RolloutBatchResult,
    RolloutItem,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[Client]:
    yield await connect(settings, identity="served-checkpoints-test", service="execution")


async def _eval_batch(client: Client, own: Settings, owner_engine: Engine, task: str,
                      checkpoint: str, *, worker_wiring: bool = False,
                      ) -> tuple[RolloutBatchInput, RolloutBatchResult, list[str]]:
    batch = RolloutBatchInput(batch_id=f"s{uuid.uuid4().hex[:10]}", purpose="eval",
                              items=[RolloutItem(task, 29, group_size=2)],
                              checkpoint_id=checkpoint, max_concurrency=2, deadline_s=120)
    # worker_wiring: the backend the worker builds from settings, as in production.
    factory = None if worker_wiring else backend_factory(own)
    async with build_worker(client, own, policy_factory=factory):
        handle = await client.start_workflow(
            ROLLOUT_WORKFLOW, request_batch(owner_engine, batch), id=f"rollout-{batch.batch_id}",
            task_queue=own.task_queue(EXECUTION_QUEUE), result_type=RolloutBatchResult)
        result = await handle.result()
        history = await handle.fetch_history()
    failures = episode_failures(history)
    return batch, result, failures


async def test_a_batch_loads_its_checkpoint_into_the_server_first(
    client: Client, settings: Settings, owner_engine: Engine, tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    trained = weights_variant(tiny_model_dir, tmp_path)  # what a training step produced
    checkpoint = register_checkpoint_dir(owner_engine, trained)
    task = make_builtin_task(owner_engine, "frozen_lake", seed=29)
    with serving(tiny_model_dir, "base", runtime_loading=True) as url:
        own = settings.model_copy(update={
            "inference_backend": "openai", "inference_url": url,
            "task_queue_prefix": f"{settings.task_queue_prefix}{uuid.uuid4().hex[:6]}-"})
        batch, result, failures = await _eval_batch(client, own, owner_engine, task, checkpoint)
        listed = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    assert (result.completed + result.truncated, result.failed, failures) == (2, 0, [])
    served = {card["id"]: card["weights_sha256"] for card in listed}
    assert served[checkpoint] == checkpoint
    with owner_engine.connect() as conn:
        stored = conn.execute(text(
            "SELECT DISTINCT checkpoint_id FROM trajectory WHERE batch_id = :b"),
            {"b": batch.batch_id}).scalars().all()
    assert stored == [checkpoint]


async def test_a_server_serving_stale_weights_under_the_id_is_refused_and_audited(
    client: Client, settings: Settings, owner_engine: Engine, tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    trained = weights_variant(tiny_model_dir, tmp_path)
    checkpoint = register_checkpoint_dir(owner_engine, trained)
    task = make_builtin_task(owner_engine, "frozen_lake", seed=29)
    # Misconfigured: the old weights, started under the new checkpoint's id.
    with serving(tiny_model_dir, checkpoint, runtime_loading=True) as url:
        own = settings.model_copy(update={
            "inference_backend": "openai", "inference_url": url,
            "task_queue_prefix": f"{settings.task_queue_prefix}{uuid.uuid4().hex[:6]}-"})
        batch, result, failures = await _eval_batch(client, own, owner_engine, task, checkpoint)
    assert result.failed == 2 and result.trajectory_ids == []
    assert len(failures) == 2  # once per episode, never retried
    assert all(f"ServedWeightsMismatch: checkpoint {checkpoint} refused" in f for f in failures)
    with owner_engine.connect() as conn:
        stored = conn.execute(text("SELECT count(*) FROM trajectory WHERE batch_id = :b"),
                              {"b": batch.batch_id}).scalar_one()
        events = conn.execute(text(
            "SELECT actor->>'service', payload->>'during', payload->>'problem' FROM audit_event "
            "WHERE action = 'integrity_violation' AND resource->>'id' = :c"),
            {"c": checkpoint}).all()
    assert stored == 0
    assert len(events) == 2
    assert all(service == "execution" and during == "loading into the inference server"
               and "hash to" in problem for service, during, problem in events)


def _full_settings(settings: Settings, url: str) -> Settings:
    return settings.model_copy(update={
        "inference_backend": "openai", "inference_url": url, "inference_reload": "full",
        "task_queue_prefix": f"{settings.task_queue_prefix}{uuid.uuid4().hex[:6]}-"})


async def test_a_batch_reloads_a_full_weight_server_to_its_checkpoint_first(
    client: Client, settings: Settings, owner_engine: Engine, tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    trained = weights_variant(tiny_model_dir, tmp_path)
    checkpoint = register_checkpoint_dir(owner_engine, trained)
    task = make_builtin_task(owner_engine, "frozen_lake", seed=29)
    app = create_app(tiny_model_dir, served_model_name="policy", device="cpu", dev_mode=True)
    with serving_app(app) as url:
        batch, result, failures = await _eval_batch(
            client, _full_settings(settings, url), owner_engine, task, checkpoint,
            worker_wiring=True)
        info = httpx.get(f"{url}/weight_info", timeout=10).json()
    assert (result.completed + result.truncated, result.failed, failures) == (2, 0, [])
    assert info["weights_sha256"] == checkpoint
    assert info["weight_version"].startswith(f"{checkpoint}@")
    reloads = [e for e in app.state.reloader.events if e[0] == "reload_weights"]
    assert reloads == [("reload_weights", checkpoint)]  # once, before the first request
    answered = {digest for name, digest in app.state.reloader.events if name == "completion"}
    assert answered == {checkpoint}
    with owner_engine.connect() as conn:
        stored = conn.execute(text(
            "SELECT DISTINCT checkpoint_id FROM trajectory WHERE batch_id = :b"),
            {"b": batch.batch_id}).scalars().all()
    assert stored == [checkpoint]


async def test_a_full_weight_server_that_mislabels_its_weights_is_refused_and_audited(
    client: Client, settings: Settings, owner_engine: Engine, tiny_model_dir: Path,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    trained = weights_variant(tiny_model_dir, tmp_path)
    checkpoint = register_checkpoint_dir(owner_engine, trained)
    task = make_builtin_task(owner_engine, "frozen_lake", seed=29)
    app = create_app(tiny_model_dir, served_model_name="policy", device="cpu", dev_mode=True)
    # The server reloads but its weight version never changes from what it said before.
    monkeypatch.setattr(app.state.reloader, "set_version", lambda version: None)
    with serving_app(app) as url:
        batch, result, failures = await _eval_batch(
            client, _full_settings(settings, url), owner_engine, task, checkpoint,
            worker_wiring=True)
    assert result.failed == 2 and result.trajectory_ids == []
    assert len(failures) == 2  # once per episode, never retried
    assert all(f"ServedWeightsMismatch: checkpoint {checkpoint} refused" in f for f in failures)
    assert not any(name == "completion" for name, _ in app.state.reloader.events)
    with owner_engine.connect() as conn:
        events = conn.execute(text(
            "SELECT payload->>'during', payload->>'problem' FROM audit_event "
            "WHERE action = 'integrity_violation' AND resource->>'id' = :c"),
            {"c": checkpoint}).all()
    assert len(events) == 2
    assert all(during == "loading into the inference server"
               and "reports weight version None" in problem for during, problem in events)
