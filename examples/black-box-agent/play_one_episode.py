"""Play one episode of a black-box agent through triloop's model gateway, without the stack.

    .venv/bin/python examples/black-box-agent/play_one_episode.py --model .triloop/models/tiny-base

It loads the contract ``tool_arithmetic_agent.yaml`` (tool_arithmetic played by the agent
program ``fixtures/agents/arithmetic_agent.py``), serves the model in-process (the torch
backend; with no ``--model`` it creates the tiny model in a temporary folder), runs the
agent in the default sandbox (bubblewrap where it works) with its base URL pointed at the
gateway, and prints what the
execution loop would store: each model call with its kind, the trajectory's segments and
breaks, and the steps the learner would train on (prompt and sampled token counts, and
that the action mask covers exactly the sampled ids). The guide is
``docs/black-box-agents.md``; ``tests/unit/test_docs_black_box_agent.py`` runs this file.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from execution_loop.command_agent import run_command_episode
from execution_loop.environments.registry import CONTRACTS_DIR, make_environment
from execution_loop.inference.torch_backend import TorchPolicyClient
from execution_loop.sandboxes import default_sandbox
from triloop.contracts import load_contract


def summary(model_dir: Path, *, task_seed: int, seed: int) -> dict[str, Any]:
    """One episode's record, as JSON-ready data."""
    contract = load_contract(CONTRACTS_DIR / "tool_arithmetic_agent.yaml")
    policy = TorchPolicyClient(model_dir, device="cpu")
    env = make_environment(contract)
    try:
        record = run_command_episode(env, policy, contract=contract,
                                     sandbox=default_sandbox(), seed=seed,
                                     task_seed=task_seed, limits=contract.limits)
    finally:
        env.close()
    gateway = record.extra["gateway"]
    return {
        "status": record.status, "failure_reason": record.failure_reason,
        "success": record.success, "total_reward": record.total_reward,
        "calls": [(c["kind"], c["rule"], c["api"]) for c in gateway["calls"]],
        "segments": gateway["segments"], "breaks": gateway["breaks"],
        "steps": [{
            "prompt_tokens": len(step.prompt_token_ids),
            "sampled_tokens": len(step.action_token_ids),
            "mask_is_exactly_the_sampled_ids": step.action_mask == (
                [0] * len(step.prompt_token_ids) + [1] * len(step.action_token_ids)),
            "action_text": step.action_text,
        } for step in record.steps],
        "agent_exit_code": record.extra["agent"]["exit_code"],
        "sandbox": record.extra["agent"]["sandbox"]["backend"],  # bubblewrap where it works
    }


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, play, print the summary as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a Hugging Face model directory")
    parser.add_argument("--task-seed", type=int, default=21)
    parser.add_argument("--seed", type=int, default=0, help="the sampling seed")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model
        if model_dir is None:
            from learning_loop.tiny_model import create_tiny_model

            model_dir = create_tiny_model(Path(scratch) / "tiny", seed=0)
        result = summary(model_dir, task_seed=args.task_seed, seed=args.seed)
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
