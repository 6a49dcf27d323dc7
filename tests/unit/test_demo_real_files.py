"""`make demo-real`'s example files are valid as shipped: the run config and the contract."""

from __future__ import annotations

from pathlib import Path

from triloop.contracts import load_contract
from triloop.run_config import load_run_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "real-model"


def test_the_lora_run_file_is_a_valid_lora_run() -> None:
    config = load_run_config((EXAMPLE / "smollm2-lora.run.yaml").read_text())
    assert config.update.lora is not None and config.update.lora.target_modules
    assert config.schedule.propose_every == config.schedule.iterations  # it proposes once


def test_the_short_contract_is_tool_arithmetic_within_the_builtin_limits() -> None:
    short = load_contract(EXAMPLE / "tool_arithmetic_short.yaml")
    builtin = load_contract(Path(__file__).resolve().parents[2] / "execution_loop"
                            / "environments" / "contracts" / "tool_arithmetic.yaml")
    assert short.task == builtin.task and short.version != builtin.version
    assert short.limits.max_turns < builtin.limits.max_turns
    assert short.limits.max_tokens_per_turn < builtin.limits.max_tokens_per_turn
    assert short.reward == builtin.reward  # the same task, only smaller
