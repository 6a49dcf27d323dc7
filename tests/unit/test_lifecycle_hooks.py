"""Lifecycle hooks: a contract adds checks before reset, after each step and after the
episode, from an installed package, without editing triloop."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from transformers import PreTrainedTokenizerBase

from execution_loop.environments import registry
from execution_loop.episode import COMPLETED, FAILED, run_episode
from execution_loop.hooks import resolve_hook
from learning_loop.tiny_model import build_tokenizer
from tests.environment_plugins import install_example, on_path
from tests.unit.test_tool_calls import ScriptedPolicy
from triloop.contracts import ContextRule, EnvironmentContract, contract_id, load_contract
from triloop.environment_code import environment_code_hashes

HOOKS = """
hooks:
  before_reset: ["letter_count_env.hooks:known_seeds_only"]
  after_step: ["letter_count_env.hooks:short_replies"]
  after_episode: ["letter_count_env.hooks:episode_summary"]
"""


@pytest.fixture(scope="module")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_example(tmp_path_factory.mktemp("plugin"))


@pytest.fixture
def hooked(example_site: Path, tmp_path: Path) -> Iterator[EnvironmentContract]:
    """The example's contract with the hooks of its own package."""
    with on_path(example_site):
        text = (example_site / "letter_count_env" / "contract.yaml").read_text() + HOOKS
        path = tmp_path / "contract.yaml"
        path.write_text(text)
        yield load_contract(path, capabilities=registry.capabilities())


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return build_tokenizer()


def play(contract: EnvironmentContract, tokenizer: PreTrainedTokenizerBase, seed: int,
         replies: list[str]) -> object:
    env = registry.make_environment(contract)
    try:
        return run_episode(env, ScriptedPolicy(tokenizer, replies), seed=0, task_seed=seed,
                           limits=contract.limits, context_rule=ContextRule())
    finally:
        env.close()


def test_hooks_note_each_step_and_the_episode(
    hooked: EnvironmentContract, tokenizer: PreTrainedTokenizerBase
) -> None:
    [answer] = registry.reference_solution("letter_count", 3, hooked)
    record = play(hooked, tokenizer, 3, [answer])
    assert record.status == COMPLETED and record.success  # type: ignore[attr-defined]
    [step] = record.steps  # type: ignore[attr-defined]
    assert step.feedback["hooks"] == {
        "letter_count_env.hooks:short_replies": {"reply_chars": len(answer)}}
    assert record.outcome_details["hooks"] == {  # type: ignore[attr-defined]
        "letter_count_env.hooks:episode_summary": {"turns": 1}}


def test_a_hook_refuses_a_step_or_a_reset(
    hooked: EnvironmentContract, tokenizer: PreTrainedTokenizerBase
) -> None:
    long_reply = play(hooked, tokenizer, 3, ["x" * 300])
    assert long_reply.status == FAILED and not long_reply.success  # type: ignore[attr-defined]
    assert "short_replies (after_step): reply 0 has 300 characters" in (
        long_reply.failure_reason)  # type: ignore[attr-defined]
    negative = play(hooked, tokenizer, -1, ["1"])
    assert negative.status == FAILED and negative.steps == []  # type: ignore[attr-defined]
    assert "seed -1 is negative" in negative.failure_reason  # type: ignore[attr-defined]


def test_hook_code_is_part_of_the_version(hooked: EnvironmentContract) -> None:
    code = environment_code_hashes("letter_count", hooks=hooked.hooks.modules()
                                   if hooked.hooks else [])
    assert "letter_count_env.hooks" in code
    plain = hooked.model_copy(update={"hooks": None})
    assert contract_id(hooked, {}) != contract_id(plain, {})


def test_hooks_outside_our_package_and_plugins_are_refused(hooked: EnvironmentContract) -> None:
    del hooked
    for reference in ("os:system", "subprocess:run"):
        with pytest.raises(ValueError, match="installed environment plugin"):
            resolve_hook(reference)
    with pytest.raises(ValidationError, match="module:function"):
        EnvironmentContract.model_validate({
            "task": "x", "observations": ["o"], "allowed_actions": ["a"],
            "success_criteria": {"exact_answer": True}, "reward": {"outcome": {"success": 1}},
            "limits": {"max_turns": 1, "wall_time_s": 1, "max_tokens_per_turn": 1,
                       "max_total_tokens": 1},
            "hooks": {"after_step": ["not a reference"]}})
