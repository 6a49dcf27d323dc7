"""The ``verifiers`` adapter against the real library: loading, play, and the rubric's verdict.

The examples are verifiers tasksets shipped as the contracts' fixtures: ``vf_arithmetic``
(single-turn, verifiers' own ``SingleAgentEnv``) and ``vf_guess_number`` (its own ``Env``,
which answers each guess with higher or lower until the guess is right).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from execution_loop.environments import registry
from execution_loop.environments import verifiers as verifiers_env
from execution_loop.environments.base import EnvironmentStateError
from execution_loop.environments.verifiers_play import (
    VerifiersEnvironmentError,
    load,
    rows,
    seat_of,
)
from execution_loop.verification import run_verifiers
from triloop.contracts import EnvironmentContract, load_contract
from triloop.environment_code import environment_code_hashes, environment_verifier_hash

pytestmark = pytest.mark.slow  # the first import of verifiers takes seconds


def arithmetic() -> EnvironmentContract:
    return registry.load_builtin_contract("verifiers")


def guessing() -> EnvironmentContract:
    return load_contract(registry.CONTRACTS_DIR / "verifiers_guess_number.yaml",
                         capabilities=registry.capabilities())


def with_state(contract: EnvironmentContract, **state: Any) -> EnvironmentContract:
    return contract.model_copy(update={"initial_state": {**contract.initial_state, **state}})


def guess_row(secret: int) -> dict[str, Any]:
    """A row of the guessing taskset with a chosen secret (an item of a dataset's own)."""
    [row] = rows(verifiers_env.spec_of(guessing()), 1)
    return {**row, "answer": str(secret)}


def test_the_contract_loads_the_taskset_through_verifiers_own_loader() -> None:
    spec = verifiers_env.spec_of(arithmetic())
    env = load(spec)
    assert type(env).__name__ == "SingleAgentEnv" and seat_of(env) == "agent"
    first = rows(spec, 3)
    assert len(first) == 3 and {"prompt", "answer", "info"} <= set(first[0])
    assert "idx" not in first[0]  # the load position is not part of a row
    assert type(load(verifiers_env.spec_of(guessing()))).__name__ == "GuessNumberEnv"


def test_a_missing_taskset_bad_args_and_a_foreign_row_are_refused_by_name() -> None:
    with pytest.raises(VerifiersEnvironmentError, match="'no_such_taskset' failed to load"):
        registry.make_environment(with_state(arithmetic(), taskset="no_such_taskset"))
    with pytest.raises(ValueError, match="initial_state.args is not JSON"):
        registry.make_environment(with_state(arithmetic(), args="{count: 3"))
    env = registry.make_environment(arithmetic())
    with pytest.raises(VerifiersEnvironmentError, match="not a row of 'vf_arithmetic'"):
        env.reset(0, {"question": "no prompt, no answer"})


def test_an_environment_of_two_agents_is_refused() -> None:
    # verifiers' user-sim pairs a modelled user with the assistant: two seats, one policy.
    contract = with_state(arithmetic(), env="user-sim")
    with pytest.raises(VerifiersEnvironmentError, match="declares agents assistant, user"):
        registry.make_environment(contract)


def test_single_turn_the_prompt_then_one_reply_ends_the_episode() -> None:
    env = registry.make_environment(arithmetic())
    [row] = rows(verifiers_env.spec_of(arithmetic()), 1)
    assert env.reset(0) == row["prompt"]
    assert env.reset(7, row) == row["prompt"]  # the item, not the seed, names the row
    before = env.state_fingerprint()
    result = env.step("12")
    assert result.done and result.feedback["ended_by"] == "agent_completed"
    assert env.state_fingerprint() != before
    with pytest.raises(EnvironmentStateError, match="episode is over"):
        env.step("again")
    assert env.verifier_request().payload["actions"] == ["12"]


def test_multi_turn_the_environment_answers_until_the_guess_is_right() -> None:
    env = registry.make_environment(guessing())
    assert "from 1 to 8" in env.reset(0, guess_row(5))
    first = env.step("2")
    assert (first.observation, first.done) == ("higher", False)
    second = env.step("I guess 7")
    assert (second.observation, second.done) == ("lower", False)
    third = env.step("5")
    assert third.done and third.feedback["truncated"] is None


def test_multi_turn_the_contracts_max_turns_ends_a_game_that_goes_on() -> None:
    env = registry.make_environment(guessing())  # max_turns: 4
    env.reset(0, guess_row(8))
    results = [env.step("1") for _ in range(4)]
    assert [r.done for r in results] == [False, False, False, True]
    assert results[-1].feedback["truncated"] == "max_turns"


def test_the_rubric_judges_replays_in_the_verifier_process() -> None:
    """One verifier interpreter (verifiers imported once) judges four episodes."""
    requests = []
    for contract, item, actions in [
        (arithmetic(), None, None),  # the reference: the row's answer
        (arithmetic(), None, ["-1"]),
        (guessing(), guess_row(6), ["3", "7", "6"]),
        (guessing(), guess_row(6), ["1", "2", "3", "4"]),
    ]:
        env = registry.make_environment(contract)
        env.reset(1, item)
        moves = actions or registry.reference_solution("verifiers", 1, contract)
        for move in moves:
            if env.step(move).done:
                break
        requests.append(env.verifier_request())
    right, wrong, guessed, out_of_turns = run_verifiers(requests)
    assert right.success and right.reward == 1.0
    assert right.details["rewards"] == {"exact_answer": 1.0}
    assert not wrong.success and wrong.reward == 0.0
    assert wrong.details["reason"] == "rubric_below"
    assert guessed.success and guessed.details["metrics"] == {"guesses": 3.0}
    assert not out_of_turns.success and out_of_turns.details["stop_condition"] == "max_turns"


def test_the_verdict_rests_on_the_replay_not_on_what_the_worker_saw() -> None:
    env = registry.make_environment(guessing())
    env.reset(0, guess_row(4))
    env.step("4")
    request = env.verifier_request()
    # A payload claiming another secret is judged against the row it names, by replay.
    forged = dataclasses.replace(request, payload={**request.payload,
                                                   "item": guess_row(3)})
    [honest, judged] = run_verifiers([request, forged])
    assert honest.success and not judged.success


def test_reference_describe_and_generate_use_the_rows() -> None:
    contract = arithmetic()
    [row0, row1] = rows(verifiers_env.spec_of(contract), 2)
    assert verifiers_env.reference_solution(1, contract) == [row1["answer"]]
    assert verifiers_env.reference_solution(9, contract, item=row0) == [row0["answer"]]
    same = verifiers_env.describe(0, row0, contract)
    assert verifiers_env.describe(0, None, contract).digest == same.digest  # seed 0 is row 0
    assert verifiers_env.describe(7, row0, contract).digest == same.digest  # the seed is no content
    assert verifiers_env.describe(0, row1, contract).digest != same.digest
    generated = list(verifiers_env.generate({"count": 3}, contract))
    assert [g.seed for g in generated] == [0, 1, 2]
    assert generated[1].item == row1
    with pytest.raises(ValueError, match="count >= 1"):
        list(verifiers_env.generate({"count": 0}, contract))
    with pytest.raises(ValueError, match="has no answer"):
        verifiers_env.reference_solution(0, contract, item={"prompt": "?", "answer": ""})


def test_the_library_and_the_adapter_count_in_the_version_and_verifier_hash() -> None:
    hashes = environment_code_hashes("verifiers")
    assert {"execution_loop.environments.verifiers",
            "execution_loop.environments.verifiers_play",
            "distribution:verifiers"} <= set(hashes)
    assert environment_verifier_hash("verifiers") is not None
