"""Disk used by a run's checkpoints, with and without retention (issue 25, item 5).

A run of N iterations of full fine-tuning through ``learning_loop.iteration`` (the update
activity's own functions, in process, without Temporal or a database), on a real model
(default: the SmolLM2-135M-Instruct directory converted by /work/wt/models/convert_example.py,
any HF directory via --model; --tiny uses the tiny model). Each iteration trains on one
group of two short samples (so the weights and the Adam state change and are saved in
full, as every iteration of a real run is), then applies retention as the learner does
after it stores an iteration: ``learning_loop.retention.CheckpointFiles.delete`` on what the
database's rule would prune for a run with nothing deployed: everything but the base, the
proposed candidates (every --propose-every) and the last --keep-last iterations.

"Without retention" is the sum of every checkpoint directory's size as saved (what the
store held before this issue, when nothing was ever deleted): measured on the same run, so
the two columns differ only by what retention deleted, and the bench never needs the
disk for N full checkpoints. "With" is the artifact directory's size after the pass.

    nice -n 10 .venv/bin/python bench/checkpoint_retention.py              # ~16 iterations
    .venv/bin/python bench/checkpoint_retention.py --tiny --iterations 6   # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from learning_loop.batch import TrainingSample
from learning_loop.checkpoints import CheckpointRef
from learning_loop.iteration import load_model, save_servable, train_iteration
from learning_loop.objective import policy_action_logprobs
from learning_loop.retention import CheckpointFiles, directory_bytes
from learning_loop.store import PrunedCheckpoint
from learning_loop.trajectory_reader import StoredStep, StoredTrajectory, to_rollout_data
from triloop.run_config import RunConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REAL_MODEL = Path("/work/wt/models/smollm2-135m-instruct")
CPU = torch.device("cpu")


def run_config(keep_last: int, iterations: int, propose_every: int) -> RunConfig:
    return RunConfig.model_validate({
        "name": "retention-bench", "model": {"base": "bench"},
        "rollout": {"task_ids": ["t"], "group_size": 2, "groups_per_iteration": 1},
        "optimizer": {"learning_rate": 1e-6}, "stability": {"pause_on_alarm": False},
        "schedule": {"iterations": iterations, "propose_every": min(propose_every, iterations)},
        "update": {"micro_batch_size": 2}, "checkpoints": {"keep_last": keep_last},
    })


def one_group(model: torch.nn.Module, version: int, vocab: int) -> list[StoredTrajectory]:
    """Two one-turn samples of a few tokens, rewards 1 and 0, logprobs from ``model``."""
    out = []
    for index, reward in enumerate((1.0, 0.0)):
        prompt = [(17 * version + 5 * index + k) % vocab for k in (11, 12, 13, 14)]
        action = [(31 * version + 7 * index + k) % vocab for k in (21, 22)]
        sample = TrainingSample("", "", "", 0, tuple(prompt), tuple(action), (0.0, 0.0), 0.0)
        logprobs = policy_action_logprobs(model, [sample], device=CPU)[0]
        step = StoredStep(0, prompt, action, [0] * 4 + [1] * 2, logprobs, reward)
        out.append(StoredTrajectory(f"e{version}-{index}", "g0", "t", version, reward, [step]))
    return out


def prunable(history: list[CheckpointRef], base: str, keep_last: int, propose_every: int
             ) -> list[PrunedCheckpoint]:
    """What ``triloop_prune_checkpoints`` prunes for a run with nothing deployed."""
    kept = {base} | {ref.id for ref in history[-keep_last:]}
    kept |= {ref.id for i, ref in enumerate(history, start=1) if i % propose_every == 0}
    stamp = datetime.now(UTC)
    return [PrunedCheckpoint(ref.id, ref.path.resolve().as_uri(), i, stamp,
                             f"keep_last={keep_last}", True)
            for i, ref in enumerate(history, start=1) if ref.id not in kept]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=REAL_MODEL)
    parser.add_argument("--tiny", action="store_true", help="the tiny random model instead")
    parser.add_argument("--iterations", type=int, default=16)
    parser.add_argument("--keep-last", type=int, default=2)
    parser.add_argument("--propose-every", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="retention-bench-") as scratch:
        work = Path(scratch)
        source = args.model
        if args.tiny:
            from learning_loop.tiny_model import create_tiny_model

            source = create_tiny_model(work / "tiny", seed=0)
        artifacts = work / "artifacts"
        started = time.monotonic()
        base_model = load_model(source, CPU)
        base = save_servable(artifacts, base_model, source, data_cursor={}, metadata={})
        vocab = int(base_model.config.vocab_size)
        del base_model
        config = run_config(args.keep_last, args.iterations, args.propose_every)
        files = CheckpointFiles(artifact_dir=artifacts)
        parent, warm = base, None
        history: list[CheckpointRef] = []
        without = directory_bytes(base.path)
        rows = []
        print(f"model {source} ({'tiny' if args.tiny else 'real'}), keep_last={args.keep_last},"
              f" candidates every {args.propose_every}", file=sys.stderr)
        for iteration in range(1, args.iterations + 1):
            tick = time.monotonic()
            scorer = warm.model if warm is not None else load_model(parent.path, CPU)
            data = to_rollout_data(one_group(scorer, iteration - 1, vocab))
            outcome = train_iteration(
                artifact_dir=artifacts, parent=parent, resume_optimizer=iteration > 1,
                reference_dir=None, config=config, data=data, iteration=iteration, history=[],
                data_cursor={"iteration": iteration}, warm=warm)
            if not outcome.weights_changed:
                raise SystemExit(f"iteration {iteration} did not change the weights")
            child = outcome.checkpoint
            without += directory_bytes(child.path)
            history.append(child)
            files.delete(prunable(history, base.id, args.keep_last, args.propose_every))
            with_retention = directory_bytes(artifacts)
            rows.append({"iteration": iteration, "without_bytes": without,
                         "with_bytes": with_retention, "seconds": time.monotonic() - tick})
            print(f"{iteration:3d}  without {without / 1e9:7.2f} GB   with"
                  f" {with_retention / 1e9:6.2f} GB   ({rows[-1]['seconds']:.1f} s)",
                  file=sys.stderr, flush=True)
            parent, warm = child, outcome.learner
        last = rows[-1]
        summary = {
            "model": str(source), "iterations": args.iterations, "keep_last": args.keep_last,
            "propose_every": args.propose_every,
            "checkpoint_bytes": directory_bytes(history[-1].path),
            "without_bytes": last["without_bytes"], "with_bytes": last["with_bytes"],
            "ratio": last["without_bytes"] / last["with_bytes"],
            "total_seconds": time.monotonic() - started, "per_iteration": rows,
        }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"after {args.iterations} iterations: {summary['without_bytes'] / 1e9:.2f} GB"
              f" without retention, {summary['with_bytes'] / 1e9:.2f} GB with keep_last="
              f"{args.keep_last} (+ base and candidates): {summary['ratio']:.1f}x less"
              f" ({summary['checkpoint_bytes'] / 1e9:.2f} GB per checkpoint,"
              f" {summary['total_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
