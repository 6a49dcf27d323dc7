"""How much a run config learns, and how much that varies with the seed, without services.

The same pieces as a training run (the execution loop's `run_episode` with the torch
policy, `to_rollout_data`, the learner's `train_iteration` with one iteration of
rollout/update overlap, so samples are one policy version old as in
`TrainingRunWorkflow`), in one process and without Temporal or PostgreSQL, so a config can
be judged over several seeds in minutes. Each seed trains on frozen_lake maps and scores
the base and the final checkpoint on *held-out* maps (seeds the run never saw).

    .venv/bin/python bench/learning_spread.py                 # the documented demo config
    .venv/bin/python bench/learning_spread.py --seeds 0 1 2 3 4 --set optimizer.learning_rate=0.01

    .venv/bin/python bench/learning_spread.py --seeds 0 --size 3 --holes 1 \
        --train-maps 100 101 102 --held-out-maps 500 501   # other maps (content checked by you)

    .venv/bin/python bench/learning_spread.py --layout corners --size 4 --holes 3 \
        --run examples/tiny-frozen-lake-corners.run.yaml     # the learning test's config

Training rollouts honour the config's rollout.max_turns and rollout.max_new_tokens (lowering
the contract's limits, as the rollout activity does); held-out scoring uses the contract's
own limits, as the learning test's eval batch does.

Prints, per seed, the training reward and training success rate by iteration, base and
final held-out reward and their difference, base and final held-out success rate (goals
reached, the verifier's verdict), and any stability alarms; then the mean and spread of
the reward differences.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import transformers
import yaml

from execution_loop.environments.registry import load_builtin_contract, make_environment
from execution_loop.episode import episode_limits, run_episode
from execution_loop.inference.torch_backend import TorchPolicyClient
from learning_loop.checkpoints import CheckpointRef
from learning_loop.iteration import load_model, save_servable, train_iteration
from learning_loop.stability import IterationMetrics
from learning_loop.tiny_model import create_tiny_model
from learning_loop.trajectory_reader import StoredStep, StoredTrajectory, to_rollout_data
from triloop.contracts import EnvironmentContract
from triloop.run_config import RunConfig

EXAMPLE_RUN = Path(__file__).resolve().parents[1] / "examples" / "tiny-frozen-lake.run.yaml"
TRAIN_MAPS = (11, 12, 13, 14)
HELD_OUT_MAPS = (21, 22, 23, 24)


LAKE: dict[str, int | str] = {}  # initial_state overrides (--size, --holes, --layout)
CONTRACT_LIMITS: dict[str, int] = {}  # limits overrides (--max-tokens-per-turn)
# The run's rollout.max_turns / rollout.max_new_tokens, for training rollouts only.
RUN_LIMITS: dict[str, int | None] = {"max_turns": None, "max_new_tokens": None}


def lake_contract() -> EnvironmentContract:
    """The shipped frozen_lake contract with this bench's initial_state overrides."""
    contract = load_builtin_contract("frozen_lake")
    if LAKE:
        contract = contract.model_copy(
            update={"initial_state": {**contract.initial_state, **LAKE}})
    if CONTRACT_LIMITS:
        contract = contract.model_copy(
            update={"limits": contract.limits.model_copy(update=CONTRACT_LIMITS)})
    return contract


def play(policy: TorchPolicyClient, task_seed: int, episode_seed: int, temperature: float,
         version: int, group: str, training: bool = False) -> StoredTrajectory:
    """One frozen_lake episode as the learner would read it from the database."""
    contract = lake_contract()
    limits = contract.limits
    if training:
        limits = episode_limits(limits, RUN_LIMITS["max_turns"], RUN_LIMITS["max_new_tokens"])
    env = make_environment(contract)
    try:
        record = run_episode(env, policy, seed=episode_seed, task_seed=task_seed,
                             limits=limits, context_rule=contract.context,
                             temperature=temperature)
    finally:
        env.close()
    steps = [StoredStep(s.index, s.prompt_token_ids, s.action_token_ids, s.action_mask,
                        s.behaviour_logprobs, s.reward) for s in record.steps]
    return StoredTrajectory(uuid.uuid4().hex, group, f"map-{task_seed}", version,
                            record.total_reward, steps, success=record.success)


def rollout(policy: TorchPolicyClient, maps: list[int], group_size: int, temperature: float,
            version: int, rng: random.Random, training: bool = False) -> list[StoredTrajectory]:
    """`group_size` episodes on each map, sampled with fresh episode seeds."""
    out = []
    for task_seed in maps:
        group = uuid.uuid4().hex
        out += [play(policy, task_seed, rng.randrange(2**31), temperature, version, group,
                     training) for _ in range(group_size)]
    return out


def held_out(path: Path, maps: tuple[int, ...], episodes: int, seed: int) -> tuple[float, float]:
    """Mean episode reward and success rate of a checkpoint over `episodes` per map
    (temperature 1)."""
    policy = TorchPolicyClient(path, device="cpu")
    rng = random.Random(seed)
    trajectories = rollout(policy, list(maps), episodes, 1.0, 0, rng)
    return (statistics.fmean(t.total_reward for t in trajectories),
            statistics.fmean(bool(t.success) for t in trajectories))


def train(config: RunConfig, base: CheckpointRef, artifacts: Path,
          train_maps: tuple[int, ...] = TRAIN_MAPS
          ) -> tuple[CheckpointRef, list[float], list[float]]:
    """The run's iterations with the workflow's one-step overlap; returns the last checkpoint."""
    rng = random.Random(config.schedule.seed)
    rollout_cfg = config.rollout
    groups = rollout_cfg.groups_per_iteration
    curve: list[float] = []
    wins: list[float] = []
    alarms: list[str] = []
    history: list[IterationMetrics] = []
    latest, previous = base, base
    for k in range(1, config.schedule.iterations + 1):
        # Batch k is sampled with c_{k-2} (the workflow starts it while c_{k-1} trains).
        sampler = previous if k > 1 else base
        maps = [train_maps[((k - 1) * groups + g) % len(train_maps)] for g in range(groups)]
        policy = TorchPolicyClient(sampler.path, device="cpu")
        batch = rollout(policy, maps, rollout_cfg.group_size, rollout_cfg.temperature,
                        max(k - 2, 0), rng, training=True)
        curve.append(statistics.fmean(t.total_reward for t in batch))
        wins.append(statistics.fmean(bool(t.success) for t in batch))
        outcome = train_iteration(
            artifact_dir=artifacts, parent=latest, resume_optimizer=k > 1, reference_dir=base.path,
            config=config, data=to_rollout_data(batch), iteration=k, history=history,
            data_cursor={"iteration": k})
        history.append(outcome.stability)
        alarms += [f"{k}:{a.kind}" for a in outcome.alarms]
        previous, latest = latest, outcome.checkpoint
    print(f"  alarms {alarms or 'none'}", flush=True)
    return latest, curve, wins


def one_seed(config: RunConfig, seed: int, eval_episodes: int,
             train_maps: tuple[int, ...] = TRAIN_MAPS,
             held_out_maps: tuple[int, ...] = HELD_OUT_MAPS) -> dict[str, Any]:
    """Train from a fresh tiny model with `seed` and score base and final on held-out maps."""
    config = config.model_copy(update={"schedule": config.schedule.model_copy(
        update={"seed": seed})})
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = create_tiny_model(root / "tiny", seed=0)
        artifacts = root / "artifacts"
        base = save_servable(artifacts, load_model(model_dir, torch.device("cpu")), model_dir)
        final, curve, wins = train(config, base, artifacts, train_maps)
        before, won_before = held_out(base.path, held_out_maps, eval_episodes, seed=1000 + seed)
        after, won_after = held_out(final.path, held_out_maps, eval_episodes, seed=1000 + seed)
    return {"seed": seed, "base": before, "final": after, "gain": after - before,
            "success_base": won_before, "success_final": won_after,
            "success_gain": won_after - won_before,
            "curve": [round(r, 2) for r in curve], "success_curve": [round(w, 2) for w in wins],
            "seconds": time.perf_counter() - started}


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`section.field=value` pairs (values parsed as JSON when they parse) onto a config."""
    for item in overrides:
        key, _, raw = item.partition("=")
        section, _, field = key.partition(".")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        data.setdefault(section, {})[field] = value
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.FIELD=VALUE", help="override one run-config field")
    parser.add_argument("--eval-episodes", type=int, default=16,
                        help="episodes per held-out map for base and final (default 16)")
    parser.add_argument("--train-maps", type=int, nargs="+", default=list(TRAIN_MAPS),
                        help="frozen_lake map seeds to train on")
    parser.add_argument("--held-out-maps", type=int, nargs="+", default=list(HELD_OUT_MAPS),
                        help="frozen_lake map seeds to score on (maps, not just seeds, must"
                             " differ from the training maps)")
    parser.add_argument("--size", type=int, help="lake size (default: the contract's)")
    parser.add_argument("--holes", type=int, help="holes per map (default: the contract's)")
    parser.add_argument("--layout", choices=["random", "corners"],
                        help="where start and goal are (default: the contract's)")
    parser.add_argument("--max-tokens-per-turn", type=int,
                        help="the contract's limits.max_tokens_per_turn, for training and"
                             " held-out scoring (default: the contract's)")
    parser.add_argument("--run", type=Path, default=EXAMPLE_RUN,
                        help="the run config to measure (default: the README's example)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    LAKE.update({k: v for k, v in (("size", args.size), ("holes", args.holes),
                                   ("layout", args.layout)) if v is not None})
    if args.max_tokens_per_turn is not None:
        CONTRACT_LIMITS["max_tokens_per_turn"] = args.max_tokens_per_turn
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    transformers.utils.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    data = apply_overrides(yaml.safe_load(args.run.read_text()), args.overrides)
    data.update({"name": "spread", "model": {"base": "tiny"},
                 "rollout": {**data.get("rollout", {}), "task_ids": ["frozen_lake"]}})
    config = RunConfig.model_validate(data)
    RUN_LIMITS.update(max_turns=config.rollout.max_turns,
                      max_new_tokens=config.rollout.max_new_tokens)
    results = []
    for seed in args.seeds:
        result = one_seed(config, seed, args.eval_episodes, tuple(args.train_maps),
                          tuple(args.held_out_maps))
        results.append(result)
        if not args.json:
            print(f"seed {seed}: reward base {result['base']:+.3f} final {result['final']:+.3f}"
                  f" gain {result['gain']:+.3f}; success base {result['success_base']:.2f}"
                  f" final {result['success_final']:.2f} ({result['seconds']:.0f}s)"
                  f" rewards {result['curve']} success {result['success_curve']}", flush=True)
    gains = [r["gain"] for r in results]
    summary = {"mean_gain": statistics.fmean(gains),
               "stdev_gain": statistics.stdev(gains) if len(gains) > 1 else 0.0,
               "min_gain": min(gains), "positive": sum(g > 0 for g in gains),
               "seeds": len(gains),
               "success_gains": [round(r["success_gain"], 3) for r in results],
               "success_positive": sum(r["success_gain"] > 0 for r in results)}
    if args.json:
        print(json.dumps({"results": results, "summary": summary}, indent=2))
    else:
        print(f"gain mean {summary['mean_gain']:+.3f}, stdev {summary['stdev_gain']:.3f},"
              f" min {summary['min_gain']:+.3f}, positive in {summary['positive']} of"
              f" {summary['seeds']} seeds; success gains {summary['success_gains']},"
              f" positive in {summary['success_positive']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
