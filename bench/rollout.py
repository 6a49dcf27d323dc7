"""Rollouts through Temporal against a plain Python loop, and trajectory ingest: COPY vs INSERT.

Usage: ``python bench/rollout.py [--episodes 64] [--concurrency 64] [--write-episodes 200]
[--database-url OWNER_URL --temporal-address HOST:PORT --opa-url URL]``.
Without the URLs it starts its own PostgreSQL, Temporal and OPA (``triloop.devstack``)
in a temporary folder and stops them afterwards.

1. Orchestration overhead. N episodes of a trivial 20-step environment (defined
   here) with a scripted policy that always answers the same action. The plain loop
   plays them one after another in this process and stores each exactly as the
   activity does (authorize, one transaction, COPY). The Temporal run is one
   ``RolloutWorkflow`` batch on an in-process worker, ``--concurrency`` episodes at
   a time. Per-step overhead = (Temporal wall - plain wall) / steps.
   Target: Temporal wall / plain wall <= 1.5 at batch 64.
2. Ingest. The same synthetic episodes (20 steps, 256 prompt and 32 action tokens
   per step) written by the execution role in one transaction per episode: binary
   COPY of the steps against one INSERT per step, and psycopg's pipelined
   ``executemany`` for reference.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from execution_loop.activities import trajectory_row
from execution_loop.contracts import EpisodeInput, EpisodeSpec
from execution_loop.environments.base import Outcome, StepResult, fingerprint
from execution_loop.episode import run_episode
from execution_loop.inference.base import FINISH_STOP, Generation, PolicyClient
from execution_loop.serving import TaskEnvironments
from execution_loop.store import StepRow, TrajectoryRow, insert_trajectory, write_trajectory
from execution_loop.worker import build_worker
from triloop.config import Settings
from triloop.db import owner_engine, role_engine
from triloop.temporal import connect
from triloop.wiring import build_authorizer
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    ROLLOUT_WORKFLOW,
    RolloutBatchInput,
    RolloutBatchResult,
    RolloutItem,
)

STEPS = 20
CONTRACT = f"""
task: bench_counter
observations: [count]
allowed_actions: [tick]
success_criteria: {{goal_reached: true}}
reward: {{outcome: {{success: 1.0}}}}
limits: {{max_turns: {STEPS}, wall_time_s: 600, max_tokens_per_turn: 4, max_total_tokens: 400}}
context: {{keep_last_turns: 2}}
"""


class Counter:
    """A trivial environment: each ``tick`` counts one; done after 20."""

    def __init__(self, contract: Any = None, *, sandbox: Any = None) -> None:
        del sandbox  # nothing to run
        self.contract = contract
        self.count = 0

    def reset(self, seed: int, item: Any = None) -> str:
        del seed  # every episode is the same
        self.count = 0
        return "count 0"

    def step(self, action: str) -> StepResult:
        self.count += 1
        return StepResult(f"count {self.count}", 0.0, self.count >= STEPS, {"ok": action == "tick"})

    def outcome(self) -> Outcome:
        return Outcome(self.count >= STEPS, float(self.count >= STEPS), {"count": self.count})

    def state_fingerprint(self) -> str:
        return fingerprint({"count": self.count})

    def close(self) -> None:
        pass


class Scripted:
    """A policy client that always answers ``tick`` (two token ids, fixed logprobs)."""

    def __init__(self, checkpoint_id: str) -> None:
        from learning_loop.tiny_model import build_tokenizer

        self.checkpoint_id = checkpoint_id
        self._tokenizer = build_tokenizer()
        self._ids = self._tokenizer.encode("tick", add_special_tokens=False)

    def tokenizer(self) -> Any:
        return self._tokenizer

    def generate(self, prompt_token_ids: list[int], **_: Any) -> Generation:
        del prompt_token_ids  # scripted: the answer never depends on the prompt
        return Generation(list(self._ids), [-0.5] * len(self._ids), "tick", FINISH_STOP)


@contextlib.contextmanager
def services(args: argparse.Namespace) -> Iterator[Settings]:
    """The given services, or a throwaway stack started for this run."""
    prefix = f"bench-{uuid.uuid4().hex[:6]}-"
    if args.database_url:
        yield Settings(database_url=args.database_url, temporal_address=args.temporal_address,
                       opa_url=args.opa_url, task_queue_prefix=prefix)
        return
    from triloop.devstack.ephemeral import ephemeral_stack

    with ephemeral_stack(queue_prefix=prefix) as settings:
        yield settings


def scripted_weights() -> tuple[Path, str]:
    """A fixed one-tensor weights directory for the scripted policy: (directory, its id).

    The execution loop verifies weights against the checkpoint id before serving, even
    for a policy that never reads them.
    """
    import tempfile

    import numpy as np
    from safetensors.numpy import save_file

    from triloop.weights import safetensors_digest

    directory = Path(tempfile.gettempdir()) / "triloop-bench-scripted-weights"
    if not (directory / "model.safetensors").is_file():
        directory.mkdir(parents=True, exist_ok=True)
        save_file({"scripted": np.zeros(4, dtype=np.float32)},
                  str(directory / "model.safetensors"))
    return directory, safetensors_digest(directory)


def register(owner: Engine) -> tuple[str, str]:
    """The bench environment version, its task and a checkpoint row: (task id, checkpoint)."""
    from triloop.contracts import contract_id, parse_contract_text

    version = contract_id(parse_contract_text(CONTRACT, base_dir=Path(".")), {})
    weights, checkpoint = scripted_weights()
    task = f"bench-task-{version[:8]}"
    with owner.begin() as conn:
        for sql, params in (
            ("INSERT INTO environment (name, description, created_by) VALUES "
             "('bench_counter', '', 'bench')", {}),
            ("INSERT INTO environment_version (id, environment_name, version, contract, "
             "contract_text, fixture_hashes, created_by) VALUES (:v, 'bench_counter', 1, '{}', "
             ":t, '{}', 'bench')", {"v": version, "t": CONTRACT}),
            ("INSERT INTO task (id, environment_version_id, seed, status, evidence) VALUES "
             "(:i, :v, 0, 'admitted', '{}')", {"i": task, "v": version}),
            ("INSERT INTO checkpoint (id, base_model, artifact_uri, created_by, data) VALUES "
             "(:c, 'scripted', :u, 'bench', '{}')", {"c": checkpoint, "u": weights.as_uri()}),
        ):
            conn.execute(text(sql + " ON CONFLICT DO NOTHING"), params)
    return task, checkpoint


def request(owner: Engine, batch_id: str, checkpoint: str) -> str:
    """Record the batch as the learning loop's request (what its Nexus call records): the
    database refuses trajectories of a batch nobody asked for."""
    with owner.begin() as conn:
        conn.execute(text(
            "INSERT INTO rollout_batch (id, purpose, checkpoint_id, requested_by) "
            "VALUES (:b, 'training', :c, 'learning')"), {"b": batch_id, "c": checkpoint})
    return batch_id


def plain_loop(settings: Settings, task: str, checkpoint: str, episodes: int) -> float:
    """Play and store the episodes one after another, as the activity does; wall seconds."""
    engine, authorizer = role_engine(settings, "execution"), build_authorizer(settings, "execution")
    opened = TaskEnvironments(engine=engine, lookup=lambda _name: Counter).task(task)
    policy: PolicyClient = Scripted(checkpoint)
    batch_id = request(owner_engine(settings), f"plain-{uuid.uuid4().hex[:8]}", checkpoint)
    started = time.perf_counter()
    for i in range(episodes):
        spec = EpisodeSpec(f"{batch_id}:0:{i}", task, 0, f"{batch_id}:0", i, checkpoint, "training")
        job = EpisodeInput(spec, batch_id, None, 0, 1.0, time.time() + 600)
        record = run_episode(opened.open(), policy, seed=i, task_seed=0,
                             limits=opened.contract.limits, context_rule=opened.contract.context)
        steps = [StepRow(s.index, s.prompt_token_ids, s.action_token_ids, s.action_mask,
                         s.behaviour_logprobs, s.observation, s.action_text, s.feedback, s.reward,
                         s.done) for s in record.steps]
        write_trajectory(engine=engine, authorizer=authorizer,
                         trajectory=trajectory_row(record, job, {}), steps=steps)
    return time.perf_counter() - started


async def temporal_batch(settings: Settings, task: str, checkpoint: str, episodes: int,
                         concurrency: int) -> float:
    """The same episodes as one RolloutWorkflow batch; wall seconds from start to result."""
    client = await connect(settings, identity="bench-rollout", service="execution")
    worker = build_worker(client, settings, policy_factory=lambda c, _d: Scripted(c),
                          environment_lookup=lambda _name: Counter,
                          max_concurrent_episodes=concurrency)
    async with worker:
        batch_id = request(owner_engine(settings), f"temporal-{uuid.uuid4().hex[:8]}", checkpoint)
        batch = RolloutBatchInput(batch_id=batch_id, purpose="training",
                                  items=[RolloutItem(task, 0, group_size=episodes)],
                                  checkpoint_id=checkpoint, max_concurrency=concurrency)
        started = time.perf_counter()
        result = await client.execute_workflow(
            ROLLOUT_WORKFLOW, batch, id=batch.batch_id,
            task_queue=settings.task_queue(EXECUTION_QUEUE), result_type=RolloutBatchResult)
        wall = time.perf_counter() - started
    if result.completed != episodes:
        raise RuntimeError(f"only {result.completed} of {episodes} episodes completed: {result}")
    return wall


def synthetic(episodes: int, task: str, checkpoint: str, batch_id: str
              ) -> list[tuple[TrajectoryRow, list[StepRow]]]:
    """Episodes shaped like real ones: 20 steps, 256 prompt and 32 action tokens each."""
    out = []
    for e in range(episodes):
        row = TrajectoryRow(id=f"ingest-{uuid.uuid4().hex}", batch_id=batch_id, task_id=task,
                            checkpoint_id=checkpoint, purpose="training", group_id="g",
                            status="completed", num_steps=STEPS)
        steps = [StepRow(i, list(range(e, e + 256)), list(range(32)), [0] * 256 + [1] * 32,
                         [-0.7] * 32, "observation " * 8, "action", {"i": i}, 0.0, i == STEPS - 1)
                 for i in range(STEPS)]
        out.append((row, steps))
    return out


def ingest(engine: Engine, episodes: Sequence[tuple[TrajectoryRow, list[StepRow]]],
           method: str, run: int) -> float:
    """Steps per second writing each episode in its own transaction."""
    started = time.perf_counter()
    for row, steps in episodes:
        row = TrajectoryRow(**{**row.__dict__, "id": f"{row.id}-{method}-{run}"})
        with engine.begin() as conn:
            raw: Any = conn.connection.driver_connection
            with raw.cursor() as cursor:
                insert_trajectory(cursor, row, steps, method=method)
    return sum(len(s) for _, s in episodes) / (time.perf_counter() - started)


def main() -> None:
    """Run both measurements and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--write-episodes", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each; the best counts")
    parser.add_argument("--database-url", help="owner URL of a migrated database")
    parser.add_argument("--temporal-address", default="127.0.0.1:7233")
    parser.add_argument("--opa-url", default="http://127.0.0.1:8181")
    args = parser.parse_args()
    with services(args) as settings:
        task, checkpoint = register(owner_engine(settings))
        plain_loop(settings, task, checkpoint, 4)  # warm-up: tokenizer, pools, OPA
        asyncio.run(temporal_batch(settings, task, checkpoint, 4, 4))
        # Alternate the two and keep each one's best: other load on the machine only slows.
        plains, orchestrated_runs = [], []
        for _ in range(args.repeats):
            plains.append(plain_loop(settings, task, checkpoint, args.episodes))
            orchestrated_runs.append(asyncio.run(
                temporal_batch(settings, task, checkpoint, args.episodes, args.concurrency)))
        plain, orchestrated = min(plains), min(orchestrated_runs)
        steps = args.episodes * STEPS
        print(f"rollout: {args.episodes} episodes x {STEPS} steps, trivial env, scripted policy, "
              f"best of {args.repeats}")
        print(f"  plain loop      {args.episodes / plain:8.1f} episodes/s  "
              f"{plain / steps * 1e3:6.2f} ms/step")
        print(f"  Temporal (c={args.concurrency:<3}) {args.episodes / orchestrated:8.1f} "
              f"episodes/s  {orchestrated / steps * 1e3:6.2f} ms/step")
        print(f"  per-step overhead {(orchestrated - plain) / steps * 1e3:+.2f} ms; "
              f"wall ratio Temporal/plain {orchestrated / plain:.2f}x (target <= 1.5x)")
        engine = role_engine(settings, "execution")
        data = synthetic(args.write_episodes, task, checkpoint,
                         request(owner_engine(settings), f"ingest-{uuid.uuid4().hex[:8]}",
                                 checkpoint))
        ingest(engine, data[:5], "copy", -1)  # warm-up
        methods = ("copy", "insert", "executemany")
        runs = [{how: ingest(engine, data, how, run) for how in methods}
                for run in range(args.repeats)]
        rates = {how: max(r[how] for r in runs) for how in methods}
        print(f"ingest: {args.write_episodes} episodes x {STEPS} steps "
              f"(256 prompt + 32 action tokens), one transaction each, best of {args.repeats}")
        for how, label in (("copy", "binary COPY"), ("insert", "INSERT per row"),
                           ("executemany", "executemany (pipeline)")):
            print(f"  {label:<24}{rates[how]:10.0f} steps/s")
        print(f"  COPY / per-row INSERT {rates['copy'] / rates['insert']:.1f}x")


if __name__ == "__main__":
    main()
