"""tool_arithmetic: seeded problems, a sandboxed Python tool, exact answers verified apart."""

from __future__ import annotations

import random

import pytest

from execution_loop.environments.base import EnvironmentStateError
from execution_loop.environments.registry import load_builtin_contract, reference_solution
from execution_loop.environments.tool_arithmetic import (
    ToolArithmetic,
    generate_problem,
    normalise_answer,
    parse_action,
)
from execution_loop.verification import run_verifiers
from triloop.contracts import EnvironmentContract, SandboxSpec


@pytest.fixture
def contract() -> EnvironmentContract:
    return load_builtin_contract("tool_arithmetic")


@pytest.fixture
def env(contract: EnvironmentContract) -> ToolArithmetic:
    return ToolArithmetic(contract)


def test_same_seed_same_problem(env: ToolArithmetic, contract: EnvironmentContract) -> None:
    other = ToolArithmetic(contract)
    assert env.reset(11) == other.reset(11)
    assert env.state_fingerprint() == other.state_fingerprint()
    assert len({env.reset(seed) for seed in range(20)}) == 20


def test_problems_have_the_answer_of_their_expression() -> None:
    for seed in range(100):
        problem = generate_problem(seed)
        value = eval(problem.expression, {"__builtins__": {"sum": sum, "range": range}})
        assert value == problem.answer, problem


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("answer: 42", ("answer", "42")),
        ("Answer:  -7 ", ("answer", "-7")),
        ("python: print(1+1)", ("run_python", "print(1+1)")),
        ("python:\n    x = 2\n    print(x)", ("run_python", "x = 2\nprint(x)")),
        ("Let me compute.\n```python\nprint(3)\n```", ("run_python", "print(3)")),
        ("the answer is 42", None),
    ],
)
def test_actions_are_parsed(text: str, parsed: tuple[str, str] | None) -> None:
    assert parse_action(text) == parsed


@pytest.mark.parametrize(
    ("text", "value"),
    [("42", "42"), (" 1,234. ", "1234"), ("$-5", "-5"), ("007", "7"), ("4.5", None), ("x", None)],
)
def test_answers_are_normalised_exactly(text: str, value: str | None) -> None:
    assert normalise_answer(text) == value


@pytest.mark.parametrize("seed", range(3))
def test_reference_solution_uses_the_tool_and_succeeds(env: ToolArithmetic, seed: int) -> None:
    env.reset(seed)
    first, second = reference_solution("tool_arithmetic", seed)
    tool = env.step(first)
    answer = str(generate_problem(seed).answer)
    assert not tool.done and tool.feedback["action"] == "run_python"
    assert f"stdout:\n{answer}" in tool.observation and "exit_code: 0" in tool.observation
    final = env.step(second)
    assert final.done and final.feedback["ended_by"] == "answer"
    outcome = env.outcome()
    assert outcome.success and outcome.reward == 1.0 and outcome.details["reason"] == "correct"


def test_what_the_code_printed_does_not_count(env: ToolArithmetic) -> None:
    env.reset(5)
    env.step("python: print('answer: correct! success=True')")
    env.step("answer: 1")
    outcome = env.outcome()
    assert not outcome.success and outcome.details["reason"] == "wrong_answer"
    assert outcome.details["expected"] == str(generate_problem(5).answer)


def test_no_answer_within_the_turn_limit(
    env: ToolArithmetic, contract: EnvironmentContract
) -> None:
    env.reset(0)
    results = [env.step("python: print(1)") for _ in range(contract.limits.max_turns)]
    assert results[-1].done and results[-1].feedback["truncated"] == "max_turns"
    assert env.outcome().details["reason"] == "no_answer"
    with pytest.raises(EnvironmentStateError):
        env.step("answer: 1")


def test_invalid_action_gets_feedback(env: ToolArithmetic) -> None:
    env.reset(0)
    result = env.step("I believe it is about 300")
    assert not result.done and result.feedback["valid_action"] is False
    assert result.observation.startswith("invalid action")


@pytest.mark.parametrize(
    ("code", "limit"),
    [("x = bytearray(8 * 1024**3)", "memory"), ("while True: pass", "cpu_time")],
)
def test_sandbox_limit_ends_the_episode_as_failed(
    contract: EnvironmentContract, code: str, limit: str
) -> None:
    tight = contract.model_copy(
        update={"sandbox": SandboxSpec(cpu_time_s=1, memory_mb=128, wall_time_s=5)}
    )
    env = ToolArithmetic(tight)
    env.reset(0)
    result = env.step(f"python: {code}")
    assert result.done
    assert result.feedback["failure"] == "sandbox_limit"
    assert result.feedback["sandbox_limit"] == limit
    assert env.outcome().details["reason"] == "sandbox_limit"


def test_code_runs_without_the_workers_secrets(
    env: ToolArithmetic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRILOOP_DATABASE_URL", "postgresql://secret")
    env.reset(0)
    result = env.step("python: import os; print(sorted(os.environ))")
    assert "TRILOOP_DATABASE_URL" not in result.observation
    # bubblewrap (the default where it works) also sets PWD, the work directory.
    assert any(f"{names}" in result.observation
               for names in (["HOME", "LANG", "PATH"], ["HOME", "LANG", "PATH", "PWD"]))


def test_random_policy_mostly_fails(contract: EnvironmentContract) -> None:
    rng = random.Random(0)
    requests = []
    for seed in range(30):
        env = ToolArithmetic(contract)
        env.reset(seed)
        done = False
        while not done:
            done = env.step(rng.choice([f"answer: {rng.randint(0, 10**6)}", "hmm"])).done
        requests.append(env.verifier_request())
    assert sum(o.success for o in run_verifiers(requests)) <= 1
