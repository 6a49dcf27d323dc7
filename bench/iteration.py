"""The iteration that matters: a whole TrainingRunWorkflow iteration against TRL GRPOTrainer.

triloop's side is the shipped path with everything on: the run's workflow on the learning
queue, each iteration's rollout batch through execution's Nexus operation and its
``RolloutWorkflow`` (episodes on the in-process torch policy, trajectories written to
PostgreSQL through the execution role and OPA), the update on ``learning-gpu``, the
checkpoint (safetensors, sha256 id), lineage and stability rows, audit events, on a
throwaway stack (``triloop.devstack.ephemeral``). As deployed, the loops are separate
services: the execution worker runs in a child process of its own, the learning workers in
this one, so the rollouts' batching engine and the learner do not share one interpreter.

The task is single-turn so both sides do the same work: the prompt is bench/trl_peer.py's
frozen-lake-like grid question, the answer is one completion, and the reward is the share of
its characters that are a move letter (L, R, U, D). Same tiny model, prompts per iteration,
group size, completion length, micro-batch, learning rate and clip range; TRL runs in a
child process of bench/trl_peer.py (``--variant trl``), so its time is measured in the
same run on the same machine.

Time per iteration is the median gap between consecutive ``training_step`` rows after the
warm-up iterations. The breakdown sums what the workflow histories say each activity,
Nexus operation and child workflow took, per iteration: rollout and update overlap by one
step, so the parts can add up to more than the whole, and the execution activities (one per
group of episodes, groups concurrent) add up to activity-seconds, not wall clock.

    .venv/bin/python bench/iteration.py                  # about five minutes on 2 cores
    .venv/bin/python bench/iteration.py --iterations 6 --group-size 8 --json

Goal (issue 14): triloop at most 1.5x TRL's time per iteration on CPU. One run's ratio moves
by about 0.1 from run to run on a 2-core machine (TRL's own time by 10%); compare the median
of several runs (bench/RESULTS.md has 26).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from bench.trl_peer import ACTIONS, LAKE, action_share
from execution_loop.environments.base import Outcome, StepResult, fingerprint
from triloop.config import Settings
from triloop.db import owner_engine
from triloop.run_config import run_config_from_data
from triloop.temporal import connect

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

GOAL = 1.5
ENVIRONMENT = "bench_lake_moves"


def contract_text(completion_tokens: int) -> str:
    """One turn, one completion of at most ``completion_tokens`` tokens."""
    return f"""
task: {ENVIRONMENT}
observations: [grid]
allowed_actions: [move]
success_criteria: {{goal_reached: true}}
reward: {{outcome: {{success: 1.0}}}}
limits: {{max_turns: 1, wall_time_s: 600, max_tokens_per_turn: {completion_tokens},
          max_total_tokens: {4 * completion_tokens}}}
context: {{keep_last_turns: 1}}
"""


class LakeMoves:
    """One question about a frozen-lake grid; reward = share of move letters in the answer."""

    def __init__(self, contract: Any = None, *, sandbox: Any = None) -> None:
        del sandbox  # nothing runs in a sandbox
        self.contract = contract
        self.reward = 0.0
        self.answered = False

    def reset(self, seed: int, item: Any = None) -> str:
        row, col = divmod(seed % 16, 4)
        self.reward, self.answered = 0.0, False
        return (f"Frozen lake grid, map {'/'.join(LAKE)}. The player is at row {row}"
                f" col {col}; the goal is at row 3 col 3. Move: answer L R U D.")

    def step(self, action: str) -> StepResult:
        self.reward, self.answered = action_share(action), True
        return StepResult("", self.reward, True, {"moves": sum(c in ACTIONS for c in action)})

    def outcome(self) -> Outcome:
        return Outcome(self.reward > 0.5, self.reward, {"share": self.reward})

    def state_fingerprint(self) -> str:
        return fingerprint({"answered": self.answered})

    def close(self) -> None:
        pass


def register(owner: Engine, prompts: int, completion_tokens: int) -> list[str]:
    """The bench environment version and one admitted task per prompt (set-up, as owner)."""
    from triloop.contracts import contract_id, parse_contract_text

    source = contract_text(completion_tokens)
    version = contract_id(parse_contract_text(source, base_dir=Path(".")), {})
    tasks = [f"bench-lake-{version[:8]}-{seed}" for seed in range(prompts)]
    with owner.begin() as conn:
        conn.execute(text(
            "INSERT INTO environment (name, description, created_by) VALUES "
            "(:n, 'bench', 'bench') ON CONFLICT DO NOTHING"), {"n": ENVIRONMENT})
        conn.execute(text(
            "INSERT INTO environment_version (id, environment_name, version, contract, "
            "contract_text, fixture_hashes, created_by) VALUES (:v, :n, 1, '{}', :t, '{}', "
            "'bench') ON CONFLICT DO NOTHING"), {"v": version, "n": ENVIRONMENT, "t": source})
        for seed, task in enumerate(tasks):
            conn.execute(text(
                "INSERT INTO task (id, environment_version_id, seed, status, evidence) VALUES "
                "(:i, :v, :s, 'admitted', '{}') ON CONFLICT DO NOTHING"),
                {"i": task, "v": version, "s": seed})
    return tasks


def run_config(args: argparse.Namespace, base: Path, tasks: Sequence[str]) -> dict[str, Any]:
    """The run: trl_peer's sizes and optimiser, every iteration measured by the same clock."""
    iterations = args.warmup + args.iterations
    return {
        "name": "iteration bench",
        "model": {"base": str(base)},
        "rollout": {"task_ids": list(tasks), "group_size": args.group_size,
                    "groups_per_iteration": len(tasks), "temperature": 1.0,
                    "deadline_s": 3600},
        "optimizer": {"learning_rate": args.learning_rate},
        "objective": {"clip_eps_low": 0.2, "clip_eps_high": 0.28},
        "update": {"micro_batch_size": args.micro_batch},
        "stability": {"pause_on_alarm": False},
        # Proposes only after the last measured iteration; the bench stops the run there
        # (no governance worker here, and proposing is not the work measured).
        "schedule": {"iterations": iterations, "propose_every": iterations, "seed": args.seed},
    }


async def run_triloop(settings: Settings, args: argparse.Namespace, base: Path
                      ) -> dict[str, Any]:
    """Train through the real workflows; per-iteration seconds and the history breakdown."""
    from learning_loop.worker import build_worker as build_learning_workers
    from triloop.workflow_api import (
        LEARNING_QUEUE,
        TRAINING_RUN_WORKFLOW,
        TrainingRunInput,
        training_run_workflow_id,
    )

    # Both loops' workers share the machine's cores (the execution worker in its child
    # process, the learner here): each torch user (the batching engine's thread, the
    # learner's) gets its share, as TRILOOP_TORCH_THREADS would be set on a machine that
    # hosts both.
    settings = settings.model_copy(update={"torch_threads": args.torch_threads})
    owner = owner_engine(settings)
    tasks = register(owner, args.prompts, args.completion_tokens)
    config = run_config(args, base, tasks)
    run_id, submitter = f"bench-run-{uuid.uuid4().hex[:8]}", f"bench-{uuid.uuid4().hex[:6]}"
    with owner.begin() as conn:  # what the web service writes before it starts a run
        conn.execute(text("INSERT INTO app_user (name, roles, created_by, disabled) VALUES "
                          "(:n, ARRAY['ml_engineer'], 'bench', false)"), {"n": submitter})
        conn.execute(text(
            "INSERT INTO training_run (id, name, submitted_by, config, status, iterations_done,"
            " workflow_id) VALUES (:i, :n, :s, CAST(:c AS jsonb), 'submitted', 0, :w)"),
            {"i": run_id, "n": config["name"], "s": submitter, "c": json.dumps(config),
             "w": training_run_workflow_id(run_id)})
    learning = await connect(settings, identity="bench-learning", service="learning")
    execution = await connect(settings, identity="bench-execution", service="execution")
    web = await connect(settings, identity="bench-web", service="web", loop="learning")
    async with AsyncExitStack() as stack:
        stack.enter_context(execution_worker_process(settings, args.prompts * args.group_size))
        for worker in build_learning_workers(learning, settings):
            await stack.enter_async_context(worker)
        handle = await web.start_workflow(
            TRAINING_RUN_WORKFLOW, TrainingRunInput(run_id=run_id, submitted_by=submitter,
                                                    config=run_config_from_data(config)),
            id=training_run_workflow_id(run_id), task_queue=settings.task_queue(LEARNING_QUEUE),
        )
        await wait_for_iterations(owner, handle, run_id, config["schedule"]["iterations"])
        # The run's own loop ends it: the web token writes only starts, signals and updates.
        await learning.get_workflow_handle(handle.id).terminate(
            "bench: every iteration measured")
    with owner.connect() as conn:
        stamps = [r[0] for r in conn.execute(text(
            "SELECT created_at FROM training_step WHERE run_id = :r ORDER BY iteration"),
            {"r": run_id})]
        rewards = [float(r[0]) for r in conn.execute(text(
            "SELECT total_reward FROM trajectory t JOIN rollout_batch b ON b.id = t.batch_id "
            "WHERE b.run_id = :r"), {"r": run_id})]
    gaps = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:], strict=False)]
    first = max(0, args.warmup - 1)
    measured = gaps[first:]
    # Only what began in the measured iterations: the warm-up's first rollouts load the
    # model and warm the execution process, which the median leaves out too.
    breakdown = await history_breakdown(learning, execution, handle.id, len(measured),
                                        since=stamps[first].timestamp())
    return {"seconds_per_iteration": statistics.median(measured), "iterations": len(stamps),
            "mean_reward": statistics.fmean(rewards) if rewards else 0.0,
            "breakdown": breakdown}


@contextmanager
def execution_worker_process(settings: Settings, episodes: int) -> Iterator[None]:
    """The execution worker in a child process (the bench's environment registered there),
    until the block ends."""
    context = multiprocessing.get_context("spawn")
    ready, tell = context.Pipe(duplex=False)
    child = context.Process(target=serve_execution, name="bench-execution-worker",
                            args=(settings.model_dump(mode="json"), episodes, tell), daemon=True)
    child.start()
    try:
        if not ready.poll(120):
            raise RuntimeError("the execution worker process did not start"
                               f" (exit {child.exitcode})")
        yield
    finally:
        child.terminate()
        child.join(30)


def serve_execution(settings_data: dict[str, Any], episodes: int, ready: Any) -> None:
    """The child process: run the execution worker until terminated."""
    import transformers

    from execution_loop.worker import build_worker

    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    settings = Settings.model_validate(settings_data)

    async def serve() -> None:
        client = await connect(settings, identity="bench-execution", service="execution")
        async with build_worker(client, settings, environment_lookup=lambda _name: LakeMoves,
                                max_concurrent_episodes=episodes):
            ready.send(True)
            await asyncio.Event().wait()

    asyncio.run(serve())


async def wait_for_iterations(owner: Engine, handle: Any, run_id: str, iterations: int) -> None:
    """Until the run has stored every iteration; a run that ends first is an error."""
    from temporalio.client import WorkflowExecutionStatus

    shown = -1
    while True:
        with owner.connect() as conn:
            done = conn.execute(text("SELECT count(*) FROM training_step WHERE run_id = :r"),
                                {"r": run_id}).scalar_one()
        if done >= iterations:
            return
        described = await handle.describe()
        if described.status != WorkflowExecutionStatus.RUNNING:
            raise RuntimeError(f"the bench run ended {described.status} after {done} "
                               "iterations; see its workflow history")
        if done != shown:
            print(f"  {done}/{iterations} iterations", file=sys.stderr, flush=True)
            shown = done
        await asyncio.sleep(1.0)


async def history_breakdown(learning: Any, execution: Any, run_workflow_id: str,
                            iterations: int, *, since: float) -> dict[str, float]:
    """Seconds per iteration by activity, Nexus operation and child workflow, from histories,
    counting what began at ``since`` (epoch seconds) or later."""
    from temporalio.api.enums.v1 import EventType

    spent: dict[str, float] = defaultdict(float)

    async def walk(client: Any, workflow_id: str, prefix: str) -> None:
        history = await client.get_workflow_handle(workflow_id).fetch_history()
        started: dict[int, tuple[str, float]] = {}
        opened = 0.0
        for event in history.events:
            at = event.event_time.ToDatetime().timestamp()
            kind = event.event_type
            if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                opened = at
            elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
                if opened >= since:
                    spent[f"{prefix}workflow wall clock"] += at - opened
            elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                name = event.activity_task_scheduled_event_attributes.activity_type.name
                started[event.event_id] = (f"{prefix}activity {name}", at)
            elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                name, began = started[event.activity_task_completed_event_attributes
                                      .scheduled_event_id]
                if began >= since:
                    spent[name] += at - began
            elif kind == EventType.EVENT_TYPE_NEXUS_OPERATION_SCHEDULED:
                attrs = event.nexus_operation_scheduled_event_attributes
                started[event.event_id] = (f"{prefix}nexus {attrs.service}.{attrs.operation}", at)
            elif kind == EventType.EVENT_TYPE_NEXUS_OPERATION_COMPLETED:
                name, began = started[event.nexus_operation_completed_event_attributes
                                      .scheduled_event_id]
                if began >= since:
                    spent[name] += at - began

    await walk(learning, run_workflow_id, "learning ")
    async for listed in execution.list_workflows("WorkflowType = 'RolloutWorkflow'"):
        # Groups (or episodes) run concurrently: their activities add up, not wall clock.
        await walk(execution, listed.id, "execution RolloutWorkflow: ")
    return {name: seconds / max(1, iterations) for name, seconds in sorted(spent.items())}


def run_trl(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    """TRL GRPOTrainer on the same model and sizes, in its own process (bench/trl_peer.py)."""
    script = Path(__file__).with_name("trl_peer.py")
    child = subprocess.run(
        [sys.executable, str(script), "--variant", "trl", "--model-dir", str(model_dir),
         "--prompts", str(args.prompts), "--group-size", str(args.group_size),
         "--completion-tokens", str(args.completion_tokens),
         "--micro-batch", str(args.micro_batch), "--iterations", str(args.iterations),
         "--warmup", str(args.warmup), "--learning-rate", str(args.learning_rate),
         "--seed", str(args.seed), "--device", "cpu"],
        capture_output=True, text=True, check=False, timeout=3600)
    if child.returncode != 0:
        raise RuntimeError(f"TRL failed (exit {child.returncode}):\n{child.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    """Run both sides and print the ratio with triloop's breakdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4, help="distinct prompts per iteration")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt")
    parser.add_argument("--completion-tokens", type=int, default=32, help="max new tokens")
    parser.add_argument("--micro-batch", type=int, default=8, help="completions per forward")
    parser.add_argument("--iterations", type=int, default=4, help="measured iterations")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured iterations first")
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--torch-threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
        help="intra-op threads of each torch user in triloop's workers (the batching engine "
        "and the learner run at once on this machine; default half the cores; TRL gets every "
        "core)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    import transformers

    from learning_loop.tiny_model import create_tiny_model
    from triloop.devstack.ephemeral import ephemeral_stack

    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    with tempfile.TemporaryDirectory(prefix="triloop-iteration-bench-") as tmp:
        model_dir = create_tiny_model(Path(tmp) / "model", seed=args.seed)
        print("triloop: TrainingRunWorkflow on a throwaway stack…", file=sys.stderr, flush=True)
        with ephemeral_stack(queue_prefix=f"iter-{uuid.uuid4().hex[:6]}-") as settings:
            ours = asyncio.run(run_triloop(settings, args, model_dir))
        print("TRL GRPOTrainer…", file=sys.stderr, flush=True)
        trl = run_trl(args, model_dir)
    ratio = ours["seconds_per_iteration"] / trl["seconds_per_iteration"]
    if args.json:
        print(json.dumps({"triloop": ours, "trl": trl, "ratio": ratio}))
        return 0
    print(f"one GRPO iteration: {args.prompts} prompts x {args.group_size} completions of up to "
          f"{args.completion_tokens} tokens, tiny model, CPU; median of {args.iterations} "
          f"after {args.warmup} warm-up")
    print(f"  triloop TrainingRunWorkflow  {ours['seconds_per_iteration']:7.2f} s/iteration "
          f"(rollout via Nexus + RolloutWorkflow + PostgreSQL, update, checkpoint, lineage)")
    print(f"  TRL GRPOTrainer              {trl['seconds_per_iteration']:7.2f} s/iteration "
          f"(sample {trl['sample_seconds']:.2f} s, update {trl['update_seconds']:.2f} s)")
    verdict = "meets" if ratio <= GOAL else "misses"
    print(f"  ratio triloop / TRL {ratio:.2f}x: {verdict} the goal of at most {GOAL}x")
    print("  where triloop's time goes, seconds per iteration (parts overlap; an execution "
          "activity is summed over its concurrent runs):")
    for name, seconds in sorted(ours["breakdown"].items(), key=lambda kv: -kv[1]):
        print(f"    {seconds:7.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
