"""Agent code never runs unisolated unless the stack or the contract says so explicitly.

"Without bubblewrap" here is real: PATH holds no ``bwrap``, so the lookup the worker makes
finds none (and the once-per-process check is run again).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pydantic
import pytest

from execution_loop.environments.registry import (
    builtin_contract_path,
    load_builtin_contract,
    make_environment,
)
from execution_loop.sandbox import LocalProcessSandbox, SandboxError
from execution_loop.sandboxes import (
    SandboxUnavailable,
    bubblewrap_problem,
    default_sandbox,
    describe,
    describe_environment_sandbox,
)
from triloop.config import Settings
from triloop.contracts import (
    ContractError,
    EnvironmentContract,
    canonical_form,
    parse_contract_text,
)
from triloop.devstack.stack import sandbox_line

needs_bwrap = pytest.mark.skipif(bubblewrap_problem() is not None,
                                 reason=f"bubblewrap cannot run here: {bubblewrap_problem()}")


@pytest.fixture(autouse=True)
def stack_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRILOOP_SANDBOX", raising=False)


@pytest.fixture
def no_bubblewrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """This process as on a machine without Debian's bubblewrap installed."""
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no bwrap on it
    bubblewrap_problem.cache_clear()
    yield
    bubblewrap_problem.cache_clear()  # the next check sees the real PATH again


def unisolated_ok(contract: EnvironmentContract) -> EnvironmentContract:
    """The contract with ``isolation: {allow_unisolated: true}``."""
    data = contract.model_dump(mode="json", exclude_none=True)
    data["isolation"] = {"allow_unisolated": True}
    allowed = EnvironmentContract.model_validate(data)
    allowed._source_dir = contract.source_dir
    return allowed


def test_without_bubblewrap_agent_code_is_refused_naming_the_package(no_bubblewrap: None) -> None:
    with pytest.raises(SandboxUnavailable) as refused:
        default_sandbox()
    message = str(refused.value)
    assert "bwrap is not installed" in message
    assert "apt-get install bubblewrap" in message and "package bubblewrap" in message
    assert "TRILOOP_SANDBOX=local" in message and "isolation.allow_unisolated" in message
    assert isinstance(refused.value, SandboxError)  # infrastructure: the episode is retried


def test_an_environment_running_agent_code_does_not_open_without_bubblewrap(
    no_bubblewrap: None
) -> None:
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        make_environment(load_builtin_contract("tool_arithmetic"))
    # One that runs no agent code needs no sandbox.
    lake = make_environment(load_builtin_contract("frozen_lake"))
    assert describe_environment_sandbox(lake)["backend"] == "none"


def test_a_contract_that_allows_it_runs_unisolated_and_the_record_says_why(
    no_bubblewrap: None
) -> None:
    contract = unisolated_ok(load_builtin_contract("tool_arithmetic"))
    assert contract.allows_unisolated
    env = make_environment(contract)
    record = describe_environment_sandbox(env)
    assert record["backend"] == "local" and record["isolation"].startswith("none:")
    assert "bwrap is not installed" in record["why"]
    assert "isolation.allow_unisolated" in record["why"]
    env.reset(3)
    assert "4" in env.step("python: print(2 + 2)").observation  # it does run


def test_the_stack_setting_runs_agent_code_unisolated_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRILOOP_SANDBOX", "local")
    chosen = default_sandbox()
    assert isinstance(chosen, LocalProcessSandbox) and chosen.name == "local"
    assert "TRILOOP_SANDBOX=local" in describe(chosen)["why"]


def test_an_unknown_stack_setting_is_refused_naming_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRILOOP_SANDBOX", "none")
    with pytest.raises(pydantic.ValidationError, match="'bubblewrap' or 'local'"):
        default_sandbox()


@needs_bwrap
def test_bubblewrap_is_used_where_it_runs_even_when_unisolated_is_allowed() -> None:
    contract = unisolated_ok(load_builtin_contract("tool_arithmetic"))
    assert describe_environment_sandbox(make_environment(contract))["backend"] == "bubblewrap"
    assert default_sandbox(allow_unisolated=True).name == "bubblewrap"


def test_the_isolation_section_is_explicit_and_keeps_older_identities() -> None:
    contract = load_builtin_contract("tool_arithmetic")
    assert contract.isolation is None and not contract.allows_unisolated
    # Absent, it is not in the canonical form: every contract written before it keeps its id.
    assert b"isolation" not in canonical_form(contract, {}, {})
    allowed = unisolated_ok(contract)
    assert b'"isolation":{"allow_unisolated":true}' in canonical_form(allowed, {}, {})
    said = EnvironmentContract.model_validate(
        {**contract.model_dump(mode="json"), "isolation": {"allow_unisolated": False}})
    assert not said.allows_unisolated and b"isolation" in canonical_form(said, {}, {})


def test_a_misspelt_isolation_field_is_refused(tmp_path: Path) -> None:
    text = builtin_contract_path("frozen_lake").read_text()
    with pytest.raises(ContractError, match=r"isolation\.allow_unisolate"):
        parse_contract_text(text + "\nisolation:\n  allow_unisolate: true\n", base_dir=tmp_path)


def test_dev_status_says_where_agent_code_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    unisolated = sandbox_line(Settings(sandbox="local"))
    assert unisolated.startswith("Sandbox") and "UNISOLATED: TRILOOP_SANDBOX=local" in unisolated
    if bubblewrap_problem() is None:
        assert "bubblewrap: agent code runs isolated" in sandbox_line(Settings())
    monkeypatch.setenv("PATH", str(tmp_path))
    missing = sandbox_line(Settings())
    assert "bwrap is not installed" in missing and "package bubblewrap" in missing
