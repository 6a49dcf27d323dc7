"""Rollout/update overlap at staleness windows k = 1, 2, 4, measured on real training runs.

``bench/overlap.py`` models the schedule; this runs it. Three short ``TrainingRunWorkflow``
runs (k = ``asynchrony.staleness_window`` 1, 2 and 4; stale samples importance-corrected)
on a throwaway stack (``triloop.devstack.ephemeral``), with the learning and execution
workers in this process: rollout batches through execution's Nexus operation and its
``RolloutWorkflow`` (bench/iteration.py's single-turn lake task on the torch policy), the
update on ``learning-gpu``, checkpoints, lineage and audit as in production.

Each side's idle time is read from the workflow histories, over the run's span (first
rollout scheduled to last update completed):

- **update idle**: no ``learning.update_policy`` activity running; split into *waiting
  for its batch* (iteration i's batch not back yet; batches come back in order, one per
  iteration) and the rest, orchestration (workflow tasks, the update's scheduling);
- **rollout idle**: no ``run_rollouts`` Nexus operation in flight: the execution side waits
  for the learner to start the next batch;
- **slot idle**: the share of the execution worker's episode slots with no episode running
  (episode activities, started to completed, in the runs' ``RolloutWorkflow`` histories).

Wall time on this machine: the two sides share its cores, so what overlap saves here is
bounded by the CPU, unlike on separate rollout and learner machines.

    .venv/bin/python bench/overlap_measured.py          # about three minutes on 2 cores
    .venv/bin/python bench/overlap_measured.py --iterations 8 --windows 1 4 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.iteration import LakeMoves, register, wait_for_iterations
from execution_loop.contracts import RUN_EPISODE_GROUP
from learning_loop.contracts import UPDATE_POLICY
from triloop.config import Settings
from triloop.db import owner_engine
from triloop.temporal import connect

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

UPDATE_ACTIVITY = UPDATE_POLICY.name
# A group of episodes (a chunk of at most max_concurrency) plays as one activity.
EPISODE_ACTIVITY = RUN_EPISODE_GROUP.name
Interval = tuple[float, float]


@dataclass(frozen=True)
class Overlap:
    """One measured run."""

    window: int
    iterations: int
    span_s: float  # first rollout scheduled to last update completed
    update_idle: float  # share of the span with no update running
    waiting_for_batch: float  # of which: its iteration's batch had not come back yet
    rollout_idle: float  # share of the span with no rollout batch in flight
    slot_idle: float  # share of episode-slot time with no episode running
    seconds_per_iteration: float


def covered(intervals: Sequence[Interval], start: float, end: float) -> float:
    """Seconds of [start, end] inside at least one interval (their union)."""
    total, reach = 0.0, start
    for begin, finish in sorted(intervals):
        begin, finish = max(begin, reach), min(finish, end)
        if finish > begin:
            total += finish - begin
            reach = finish
    return total


def idle_share(intervals: Sequence[Interval], start: float, end: float) -> float:
    """Share of [start, end] outside every interval."""
    span = end - start
    return 1.0 - covered(intervals, start, end) / span if span > 0 else 0.0


async def intervals_of(client: Any, workflow_id: str) -> dict[str, list[Interval]]:
    """Activity (started to completed) and Nexus operation (scheduled to completed or
    cancelled) intervals of one workflow's history, by activity type or operation."""
    from temporalio.api.enums.v1 import EventType

    history = await client.get_workflow_handle(workflow_id).fetch_history()
    names: dict[int, str] = {}
    begun: dict[int, float] = {}
    found: dict[str, list[Interval]] = {}
    for event in history.events:
        at = event.event_time.ToDatetime().timestamp()
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names[event.event_id] = event.activity_task_scheduled_event_attributes \
                .activity_type.name
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            begun[event.activity_task_started_event_attributes.scheduled_event_id] = at
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            scheduled = event.activity_task_completed_event_attributes.scheduled_event_id
            found.setdefault(names[scheduled], []).append((begun.get(scheduled, at), at))
        elif kind == EventType.EVENT_TYPE_NEXUS_OPERATION_SCHEDULED:
            names[event.event_id] = event.nexus_operation_scheduled_event_attributes.operation
            begun[event.event_id] = at
        elif kind in (EventType.EVENT_TYPE_NEXUS_OPERATION_COMPLETED,
                      EventType.EVENT_TYPE_NEXUS_OPERATION_CANCELED):
            attrs = (event.nexus_operation_completed_event_attributes
                     if kind == EventType.EVENT_TYPE_NEXUS_OPERATION_COMPLETED
                     else event.nexus_operation_canceled_event_attributes)
            found.setdefault(names[attrs.scheduled_event_id], []).append(
                (begun[attrs.scheduled_event_id], at))
    return found


def run_config(base: Path, tasks: Sequence[str], window: int, iterations: int,
               group_size: int) -> dict[str, Any]:
    """A short run at staleness window ``window`` (stale samples corrected, never dropped)."""
    return {
        "name": f"overlap bench k={window}",
        "model": {"base": str(base)},
        "rollout": {"task_ids": list(tasks), "group_size": group_size,
                    "groups_per_iteration": len(tasks), "temperature": 1.0,
                    "deadline_s": 3600},
        "optimizer": {"learning_rate": 1e-6},
        "update": {"micro_batch_size": 16, "stale_samples": "importance_correct"},
        "stability": {"pause_on_alarm": False},
        "asynchrony": {"staleness_window": window},
        # Proposes after the last iteration; the bench stops the run there.
        "schedule": {"iterations": iterations, "propose_every": iterations, "seed": 0},
    }


async def measure(settings: Settings, base: Path, args: argparse.Namespace) -> list[Overlap]:
    """One run per window, in turn, on the same workers; each one's idle shares."""
    from execution_loop.worker import build_worker as build_execution_worker
    from learning_loop.worker import build_worker as build_learning_workers
    from triloop.run_config import run_config_from_data
    from triloop.workflow_api import (
        LEARNING_QUEUE,
        TRAINING_RUN_WORKFLOW,
        TrainingRunInput,
        training_run_workflow_id,
    )

    owner = owner_engine(settings)
    tasks = register(owner, args.prompts, args.completion_tokens)
    submitter = f"bench-{uuid.uuid4().hex[:6]}"
    with owner.begin() as conn:
        conn.execute(text("INSERT INTO app_user (name, roles, created_by, disabled) VALUES "
                          "(:n, ARRAY['ml_engineer'], 'bench', false)"), {"n": submitter})
    learning = await connect(settings, identity="bench-learning", service="learning")
    execution = await connect(settings, identity="bench-execution", service="execution")
    web = await connect(settings, identity="bench-web", service="web", loop="learning")
    results = []
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(build_execution_worker(
            execution, settings, environment_lookup=lambda _name: LakeMoves,
            max_concurrent_episodes=args.slots))
        for worker in build_learning_workers(learning, settings):
            await stack.enter_async_context(worker)
        for window in args.windows:
            config = run_config(base, tasks, window, args.iterations, args.group_size)
            run_id = f"bench-overlap-{window}-{uuid.uuid4().hex[:8]}"
            with owner.begin() as conn:  # what the web service writes before it starts a run
                conn.execute(text(
                    "INSERT INTO training_run (id, name, submitted_by, config, status,"
                    " iterations_done, workflow_id) VALUES (:i, :n, :s, CAST(:c AS jsonb),"
                    " 'submitted', 0, :w)"),
                    {"i": run_id, "n": config["name"], "s": submitter,
                     "c": json.dumps(config), "w": training_run_workflow_id(run_id)})
            print(f"k = {window}: {args.iterations} iterations…", file=sys.stderr, flush=True)
            handle = await web.start_workflow(
                TRAINING_RUN_WORKFLOW, TrainingRunInput(run_id=run_id, submitted_by=submitter,
                                                        config=run_config_from_data(config)),
                id=training_run_workflow_id(run_id),
                task_queue=settings.task_queue(LEARNING_QUEUE))
            await wait_for_iterations(owner, handle, run_id, args.iterations)
            found: dict[str, list[Interval]] = {}
            while len(found.get(UPDATE_ACTIVITY, [])) < args.iterations:  # the last report
                found = await intervals_of(learning, handle.id)
                await asyncio.sleep(0.2)
            # The run's own loop ends it: the web token writes only starts, signals and updates.
            await learning.get_workflow_handle(handle.id).terminate(
                "bench: every iteration measured")
            results.append(await summarize(execution, run_id, window, found, args))
    return results


async def summarize(execution: Any, run_id: str, window: int,
                    found: dict[str, list[Interval]], args: argparse.Namespace) -> Overlap:
    """A run's idle shares from its own and its rollout batches' histories."""
    updates, rollouts = found[UPDATE_ACTIVITY], found.get("run_rollouts", [])
    start, end = min(b for b, _ in rollouts), max(f for _, f in updates)
    episodes: list[Interval] = []
    async for listed in execution.list_workflows("WorkflowType = 'RolloutWorkflow'"):
        if run_id in listed.id:
            episodes += (await intervals_of(execution, listed.id)).get(EPISODE_ACTIVITY, [])
    busy = sum(min(f, end) - max(b, start) for b, f in episodes if min(f, end) > max(b, start))
    span = end - start
    return Overlap(window, args.iterations, span, idle_share(updates, start, end),
                   batch_wait(sorted(rollouts), sorted(updates), start) / span,
                   idle_share(rollouts, start, end), 1.0 - busy / (args.slots * span),
                   span / args.iterations)


def batch_wait(rollouts: Sequence[Interval], updates: Sequence[Interval], start: float
               ) -> float:
    """Seconds the learner waited for its iteration's batch: from the previous update's end
    (or the start) until batch i came back, when that was before update i began. The rest
    of its idle time is orchestration between a batch's return and its update's start."""
    waited, previous_end = 0.0, start
    for (_, returned), (began, finished) in zip(rollouts, updates, strict=False):
        waited += max(0.0, min(returned, began) - previous_end)
        previous_end = finished
    return waited


def main() -> int:
    """Measure each window and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=2, help="groups per batch")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--completion-tokens", type=int, default=16)
    parser.add_argument("--slots", type=int, default=8, help="episodes running at once")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    import torch
    import transformers

    from learning_loop.tiny_model import create_tiny_model
    from triloop.devstack.ephemeral import ephemeral_stack

    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    with tempfile.TemporaryDirectory(prefix="triloop-overlap-bench-") as tmp:
        model_dir = create_tiny_model(Path(tmp) / "model", seed=0)
        with ephemeral_stack(queue_prefix=f"ovl-{uuid.uuid4().hex[:6]}-") as settings:
            results = asyncio.run(measure(settings, model_dir, args))
    if args.json:
        print(json.dumps([asdict(r) for r in results]))
        return 0
    base = results[0]
    print(f"overlap, measured: {args.iterations} iterations per run, {args.prompts} groups x"
          f" {args.group_size} single-turn episodes per batch on {args.slots} episode slots,"
          " tiny model, CPU (both sides share this machine's cores)")
    print(f"{'k':>3} {'update idle':>12} {'(for batch)':>12} {'rollout idle':>13}"
          f" {'slot idle':>10} {'s/iteration':>12} {'vs k=1':>7}")
    for r in results:
        print(f"{r.window:>3} {r.update_idle:>11.1%} {r.waiting_for_batch:>11.1%}"
              f" {r.rollout_idle:>12.1%}"
              f" {r.slot_idle:>9.1%} {r.seconds_per_iteration:>12.2f}"
              f" {base.seconds_per_iteration / r.seconds_per_iteration:>6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
