"""fix_ci_failure: a reproducible pinned repository, a fresh working copy per episode,
and a verifier that re-runs the pinned suite outside the agent's sandbox."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from execution_loop.environments import ci_repo
from execution_loop.environments.ci_actions import parse_action
from execution_loop.environments.fix_ci_failure import REPORT_FILE, FixCiFailure, pinned_commits
from execution_loop.environments.registry import load_builtin_contract, reference_solution
from execution_loop.sandboxes import bubblewrap_problem, describe_environment_sandbox
from execution_loop.verification import run_verifiers
from triloop.contracts import EnvironmentContract, SandboxSpec

PRICING = "shop/pricing.py"
SHOP = 1  # seeds pick ledger, shop, units in turn


@pytest.fixture
def contract() -> EnvironmentContract:
    return load_builtin_contract("fix_ci_failure")


@pytest.fixture
def env(contract: EnvironmentContract) -> Iterator[FixCiFailure]:
    environment = FixCiFailure(contract)
    yield environment
    environment.close()


def fixed_source(env: FixCiFailure) -> str:
    text = (env.workdir / PRICING).read_text()
    return text.replace("quantity > 50", "quantity >= 50").replace(
        "amount * percent // 100", "amount * (100 - percent) // 100"
    )


def edit(path: str, content: str) -> str:
    return f"edit {path}\n{content}"


def test_repository_builds_the_pinned_commit_every_time(
    contract: EnvironmentContract, tmp_path: Path
) -> None:
    commits = pinned_commits(contract)
    assert sorted(commits) == ["ledger", "shop", "units"]
    for name, commit in commits.items():
        fixture = contract.fixture_path("fixtures/ci_repos") / name
        first = ci_repo.build_repository(fixture, tmp_path / name / "a")
        second = ci_repo.build_repository(fixture, tmp_path / name / "b")
        assert first == second == commit


def test_same_seed_same_observation_and_fresh_copy(
    env: FixCiFailure, contract: EnvironmentContract
) -> None:
    first = env.reset(SHOP)
    fingerprint = env.state_fingerprint()
    assert "command_exit_code: 1" in first
    assert "failing: test_apply_discount_takes_percent_off, test_bulk_discount_from_fifty" in first
    env.step(edit(PRICING, "broken = True\n"))
    assert env.state_fingerprint() != fingerprint
    other = FixCiFailure(contract)
    try:
        assert other.reset(SHOP + 3) == first  # the same repository again
        assert "ledger/balance.py" in other.reset(0) and "units/convert.py" in other.reset(2)
        assert env.reset(SHOP) == first and env.state_fingerprint() == fingerprint
        assert "broken" not in (env.workdir / PRICING).read_text()
    finally:
        other.close()


@pytest.mark.parametrize(("seed", "passed"), [(0, 6), (SHOP, 7), (2, 5)])
def test_reference_solution_succeeds_on_every_repository(
    env: FixCiFailure, seed: int, passed: int
) -> None:
    env.reset(seed)
    results = [env.step(a) for a in reference_solution("fix_ci_failure", seed)]
    assert all(r.feedback["valid_action"] for r in results)
    assert results[-1].done and results[-1].feedback["ended_by"] == "ci_green"
    assert f"test_report: {passed} passed, 0 failed, 0 skipped" in results[-1].observation
    outcome = env.outcome()
    assert outcome.success, outcome.details
    assert outcome.details["checks"] == {
        "trusted_result": True,
        "all_tests_pass": True,
        "no_new_failures": True,
        "coverage_drop_lt": True,
    }


def test_skipping_the_failing_tests_is_a_failure(env: FixCiFailure) -> None:
    env.reset(SHOP)
    env.step("skip_test test_bulk_discount_from_fifty")
    env.step("skip_test test_apply_discount_takes_percent_off")
    result = env.step("run_tests")
    assert result.done and "2 skipped" in result.observation  # the agent's CI is green...
    outcome = env.outcome()  # ...the verifier is not fooled
    assert not outcome.success
    assert outcome.details["skipped_tests"] == [
        "test_apply_discount_takes_percent_off",
        "test_bulk_discount_from_fifty",
    ]
    assert outcome.details["new_failures"] == outcome.details["skipped_tests"]


def test_skipping_a_passing_test_after_fixing_is_a_new_failure(env: FixCiFailure) -> None:
    env.reset(SHOP)
    env.step(edit(PRICING, fixed_source(env)))
    env.step("skip_test test_format_price")
    outcome = env.outcome()
    assert not outcome.success and outcome.details["reason"] == "no_new_failures"
    assert outcome.details["failing_tests"] == []


def test_editing_the_tests_or_the_runner_does_not_fool_the_verifier(env: FixCiFailure) -> None:
    env.reset(SHOP)
    env.step(edit("tests/test_pricing.py", "def test_everything() -> None:\n    pass\n"))
    env.step(edit("run_tests.py", "print('7 passed')\n"))
    result = env.step("run_tests")
    assert result.done and result.feedback["exit_code"] == 0
    outcome = env.outcome()
    assert not outcome.success
    assert outcome.details["protected_files_changed"] == ["tests", "run_tests.py"]
    assert outcome.details["failing_tests"] == [
        "test_apply_discount_takes_percent_off",
        "test_bulk_discount_from_fifty",
    ]


def test_coverage_drop_fails_the_contract(env: FixCiFailure) -> None:
    env.reset(SHOP)
    dead_code = "".join(
        f"\n\ndef unused_{i}(x: int) -> int:\n    return x + {i}\n" for i in range(5)
    )
    env.step(edit(PRICING, fixed_source(env) + dead_code))
    assert env.step("run_tests").done
    outcome = env.outcome()
    assert not outcome.success and outcome.details["reason"] == "coverage_drop_lt"
    assert outcome.details["coverage_drop"] > 0.005
    assert outcome.details["failing_tests"] == []


def test_infinite_loop_in_the_code_ends_the_episode_as_sandbox_limit(
    contract: EnvironmentContract,
) -> None:
    tight = contract.model_copy(update={"sandbox": SandboxSpec(cpu_time_s=1, wall_time_s=5)})
    env = FixCiFailure(tight)
    try:
        env.reset(SHOP)
        body = "    return sum(price * quantity for price, quantity in items)"
        env.step(edit(PRICING, fixed_source(env).replace(body, "    while True:\n        pass")))
        result = env.step("run_tests")
        assert result.done and result.feedback["failure"] == "sandbox_limit"
        assert "sandbox limit exceeded: cpu_time" in result.observation
    finally:
        env.close()


@pytest.mark.parametrize("path", ["../outside.py", "/etc/passwd", ".git/config", "shop/../../x"])
def test_paths_outside_the_working_copy_are_refused(env: FixCiFailure, path: str) -> None:
    env.reset(SHOP)
    result = env.step(edit(path, "x = 1\n"))
    assert result.feedback["valid_action"] is False
    assert not (env.workdir.parent / "outside.py").exists()


def test_symlinks_out_of_the_working_copy_are_refused(env: FixCiFailure, tmp_path: Path) -> None:
    env.reset(SHOP)
    target = tmp_path / "victim.txt"
    target.write_text("keep me")
    (env.workdir / "link.txt").symlink_to(target)  # as the agent's code could have done
    assert env.step(edit("link.txt", "overwritten")).feedback["valid_action"] is False
    assert env.step("cat link.txt").feedback["valid_action"] is False
    assert target.read_text() == "keep me"


def test_read_and_replace_actions(env: FixCiFailure) -> None:
    env.reset(SHOP)
    shown = env.step(f"cat {PRICING}")
    assert "def bulk_discount_percent" in shown.observation
    missing = env.step(f"replace {PRICING}\n<<<<<<< SEARCH\nnot there\n=======\nx\n>>>>>>> REPLACE")
    assert missing.feedback["valid_action"] is False and "not found" in missing.observation
    assert env.step("rm -rf /").observation.startswith("invalid action: unknown command")


def test_action_parsing() -> None:
    assert parse_action("run_tests").kind == "retry_ci"  # type: ignore[union-attr]
    edit_action = parse_action("edit a.py\nx = 1")
    assert edit_action.content == "x = 1\n"  # type: ignore[union-attr]
    assert isinstance(parse_action("skip_test a b"), str)
    assert isinstance(parse_action("skip_test ../x"), str)
    assert isinstance(parse_action(""), str)


def test_fixture_drift_is_refused(contract: EnvironmentContract) -> None:
    state = {**contract.initial_state, "commits": f"ledger@{'0' * 40} shop@x units@y"}
    drifted = FixCiFailure(contract.model_copy(update={"initial_state": state}))
    try:
        with pytest.raises(ci_repo.FixtureError, match="pins"):
            drifted.reset(0)
    finally:
        drifted.close()


def test_random_policy_mostly_fails(contract: EnvironmentContract) -> None:
    rng = random.Random(0)
    choices = [
        "run_tests",
        "skip_test test_format_price",
        "skip_test test_bulk_discount_from_fifty",
        f"cat {PRICING}",
        edit(PRICING, "def subtotal(items):\n    return 0\n"),
        "make it pass",
    ]
    requests, envs = [], []
    for seed in range(4):
        env = FixCiFailure(contract)
        envs.append(env)
        env.reset(seed)
        done = False
        while not done:
            done = env.step(rng.choice(choices)).done
        requests.append(env.verifier_request())
    try:
        assert not any(o.success for o in run_verifiers(requests))
    finally:
        for env in envs:
            env.close()


needs_bwrap = pytest.mark.skipif(bubblewrap_problem() is not None,
                                 reason=f"bubblewrap cannot run here: {bubblewrap_problem()}")


@needs_bwrap
def test_the_agents_ci_and_the_verifiers_suite_run_under_bubblewrap(env: FixCiFailure) -> None:
    assert describe_environment_sandbox(env)["backend"] == "bubblewrap"
    env.reset(SHOP)
    for action in reference_solution("fix_ci_failure", SHOP):
        env.step(action)
    assert not (env.workdir / REPORT_FILE).exists()  # read, then removed from the copy
    outcome = env.outcome()
    assert outcome.success and outcome.details["suite_sandbox"] == "bubblewrap"


@needs_bwrap
def test_code_in_the_agents_ci_run_sees_only_the_working_copy(
    env: FixCiFailure, tmp_path: Path
) -> None:
    secret = tmp_path / "worker-home" / "secrets.env"
    secret.parent.mkdir()
    secret.write_text("TRILOOP_DB_PASSWORD=hunter2\n")
    env.reset(SHOP)
    outside = env.workdir.parent / "planted"
    # A test the agent adds: it probes the host, then (after the runner wrote its report)
    # swaps the report for a link to the secret, hoping the worker reads it back.
    probe = f"""
import atexit, os

def swap():
    os.remove({REPORT_FILE!r})
    os.symlink({str(secret)!r}, {REPORT_FILE!r})

def test_probe():
    seen = []
    try:
        seen.append(open({str(secret)!r}).read())
    except OSError as exc:
        seen.append(type(exc).__name__)
    try:
        open({str(outside)!r}, "w").write("x")
        seen.append("wrote outside")
    except OSError as exc:
        seen.append(type(exc).__name__)
    atexit.register(swap)
    raise AssertionError("probe: " + " | ".join(seen))
"""
    result = env.step(edit("tests/test_probe.py", probe))
    assert result.feedback["valid_action"]
    result = env.step("run_tests")
    observation = result.observation
    assert "probe: " in observation, observation
    assert "hunter2" not in observation
    # Beside the copy is the sandbox's own /tmp: a write there never reaches the host's.
    assert not outside.exists()
    assert "the runner wrote no report" in observation  # the planted link was not followed
    assert not os.path.lexists(env.workdir / REPORT_FILE)
