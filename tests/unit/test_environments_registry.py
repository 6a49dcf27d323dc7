"""The registry of built-in environments and the out-of-process verifier runner."""

from __future__ import annotations

import pytest

from execution_loop.environments.frozen_lake import FrozenLake
from execution_loop.environments.registry import (
    UnknownEnvironmentError,
    builtin_contract_path,
    get_environment,
    list_environments,
    load_builtin_contract,
    make_environment,
    reference_solution,
)
from execution_loop.verification import (
    VerificationError,
    VerifierRequest,
    run_verifier,
    run_verifiers,
)
from triloop.contracts import ContractError


def test_the_builtin_environments_with_contract_files() -> None:
    assert list_environments() == ["fix_ci_failure", "frozen_lake", "gymnasium_text",
                                   "openenv", "reasoning_gym", "tool_arithmetic", "verifiers"]
    for name in list_environments():
        assert builtin_contract_path(name).is_file()
        assert load_builtin_contract(name).task == name


@pytest.mark.parametrize("name", ["frozen_lake", "tool_arithmetic", "fix_ci_failure",
                                  "verifiers"])
def test_every_environment_follows_the_interface(name: str) -> None:
    env = get_environment(name)()
    try:
        first = env.reset(4)
        assert isinstance(first, str) and first
        assert len(env.state_fingerprint()) == 64
        for action in reference_solution(name, 4):
            result = env.step(action)
            assert isinstance(result.reward, float) and isinstance(result.feedback, dict)
        assert result.done
        outcome = env.outcome()
        assert outcome.success and outcome.reward == 1.0
    finally:
        env.close()


def test_unknown_environment() -> None:
    with pytest.raises(UnknownEnvironmentError, match="known: fix_ci_failure"):
        get_environment("chess")


def test_factory_refuses_a_contract_for_another_task_or_beyond_its_environment() -> None:
    lake = load_builtin_contract("frozen_lake")
    with pytest.raises(ValueError, match="not 'tool_arithmetic'"):
        get_environment("tool_arithmetic")(lake)
    teleport = lake.model_copy(update={"allowed_actions": ["left", "teleport"]})
    with pytest.raises(ContractError, match="no action 'teleport'"):
        make_environment(teleport)


def test_verifiers_run_in_another_process_in_one_batch() -> None:
    env = FrozenLake(load_builtin_contract("frozen_lake"))
    requests = []
    for seed in range(3):
        env.reset(seed)
        for action in reference_solution("frozen_lake", seed):
            env.step(action)
        requests.append(env.verifier_request())
    assert [o.success for o in run_verifiers(requests)] == [True, True, True]
    assert run_verifiers([]) == []


def test_only_environment_verifiers_may_be_run() -> None:
    with pytest.raises(ValueError, match="execution_loop.environments"):
        run_verifier(VerifierRequest("os:system", {"command": "true"}))


def test_a_crashing_verifier_is_an_infrastructure_error() -> None:
    request = VerifierRequest("execution_loop.environments.frozen_lake:verify", {"seed": 1})
    with pytest.raises(VerificationError, match="KeyError"):
        run_verifier(request)
