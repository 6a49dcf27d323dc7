"""Environments by name: factories, contract files, reference solutions.

The built-in ones ship a contract YAML in ``contracts/``; installed packages add more
through the ``triloop.environments`` entry-point group (``plugins``). Each declares
what it supports (``TaskCapabilities``), so a contract naming an action, observation,
criterion or reward term its environment does not implement is refused before any
episode runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from execution_loop.environments import (
    fix_ci_failure,
    frozen_lake,
    gymnasium_text,
    openenv,
    reasoning_gym,
    service,
    tool_arithmetic,
)
from execution_loop.environments import verifiers as verifiers_env
from execution_loop.environments.base import (
    Describe,
    Environment,
    EnvironmentFactory,
    Generate,
    GeneratedTask,
    TaskCapabilities,
    TaskContent,
    reset_task,
)
from execution_loop.environments.plugins import PluginError, installed_plugins, load_plugin
from execution_loop.environments.service import ServiceEnvironment
from execution_loop.sandbox import SandboxBackend
from triloop.contract_checks import capability_problems
from triloop.contracts import ContractError, EnvironmentContract, load_contract

CONTRACTS_DIR = Path(__file__).resolve().parent / "contracts"


@dataclass(frozen=True)
class _Builtin:
    """One environment: how to build it, what it supports, its reference solution, and
    optionally what a task's content is (``describe``; else ``default_describe``) and a
    procedural source of tasks (``generate``)."""

    build: Callable[..., Environment]
    capabilities: TaskCapabilities
    reference: Callable[..., list[str]]  # (seed, contract, item=None)
    describe: Describe | None = None
    generate: Generate | None = None


_BUILTINS: dict[str, _Builtin] = {
    "frozen_lake": _Builtin(
        frozen_lake.FrozenLake, frozen_lake.CAPABILITIES, frozen_lake.reference_solution,
        describe=frozen_lake.describe,
    ),
    "tool_arithmetic": _Builtin(
        tool_arithmetic.ToolArithmetic,
        tool_arithmetic.CAPABILITIES,
        tool_arithmetic.reference_solution,
        describe=tool_arithmetic.describe,
    ),
    "fix_ci_failure": _Builtin(
        fix_ci_failure.FixCiFailure, fix_ci_failure.CAPABILITIES, fix_ci_failure.reference_solution,
        describe=fix_ci_failure.describe,
    ),
    "gymnasium_text": _Builtin(
        gymnasium_text.GymnasiumText, gymnasium_text.CAPABILITIES,
        gymnasium_text.reference_solution, describe=gymnasium_text.describe,
    ),
    "openenv": _Builtin(
        openenv.OpenEnv, openenv.CAPABILITIES, openenv.reference_solution
    ),
    "reasoning_gym": _Builtin(
        reasoning_gym.ReasoningGym, reasoning_gym.CAPABILITIES, reasoning_gym.reference_solution,
        describe=reasoning_gym.describe, generate=reasoning_gym.generate,
    ),
    "verifiers": _Builtin(
        verifiers_env.VerifiersEnvironment,
        verifiers_env.CAPABILITIES,
        verifiers_env.reference_solution,
        describe=verifiers_env.describe,
        generate=verifiers_env.generate,
    ),
}


class UnknownEnvironmentError(LookupError):
    """No built-in or installed environment has that name."""


@cache
def _plugin(name: str) -> _Builtin | None:
    """An installed plugin's entry, loaded once per process (None when none is installed)."""
    entry = installed_plugins().get(name)
    if entry is None:
        return None
    if name in _BUILTINS:
        raise PluginError(f"environment plugin {entry.value} takes the built-in name {name!r}")
    plugin = load_plugin(entry)
    return _Builtin(plugin.build, plugin.capabilities, plugin.reference,
                    describe=plugin.describe, generate=plugin.generate)


def ensure_plugins_load() -> None:
    """Load every installed plugin now, raising ``PluginError`` for the first broken one."""
    names = installed_plugins()
    for name in sorted(names.keys() & _BUILTINS.keys()):
        _plugin(name)  # raises: a plugin may not shadow a built-in
    for name in sorted(names):
        _builtin(name)


def _builtin(name: str) -> _Builtin:
    entry = _BUILTINS.get(name) or _plugin(name)
    if entry is None:
        known = ", ".join(list_environments())
        raise UnknownEnvironmentError(f"no environment {name!r} (known: {known})") from None
    return entry


def list_environments() -> list[str]:
    """Names of the built-in environments and of the installed plugins."""
    return sorted({*_BUILTINS, *installed_plugins()})


def capabilities() -> dict[str, TaskCapabilities]:
    """What each environment supports, for ``validate_contract_text(capabilities=...)``."""
    return {name: _builtin(name).capabilities for name in list_environments()}


def is_builtin(name: str) -> bool:
    """Whether ``name`` is compiled into triloop (not an installed plugin)."""
    return name in _BUILTINS


def plugin_source(name: str) -> str:
    """``distribution: module:Class`` of an installed plugin."""
    entry = installed_plugins()[name]
    return f"{entry.dist.name if entry.dist else '?'}: {entry.value}"


def builtin_contract_path(name: str) -> Path:
    """The contract file shipped with a built-in environment."""
    if name not in _BUILTINS:
        _builtin(name)  # unknown: say so; a plugin ships its contract in its own package
        raise UnknownEnvironmentError(f"{name!r} is a plugin: its contract ships with it")
    return CONTRACTS_DIR / f"{name}.yaml"


@cache
def load_builtin_contract(name: str) -> EnvironmentContract:
    """The shipped contract, validated against the environment's capabilities."""
    return load_contract(builtin_contract_path(name), capabilities=capabilities())


def check_contract(contract: EnvironmentContract) -> None:
    """Raise ``ContractError`` if the environment cannot honour the contract."""
    data = contract.model_dump(mode="json")
    problems = capability_problems(
        data,
        capabilities(),
        frozenset(type(contract.success_criteria).model_fields),
        lambda _loc: None,
    )
    if problems:
        raise ContractError(problems, source=f"for {contract.task}")


def get_environment(name: str) -> EnvironmentFactory:
    """A factory for the named environment (the shipped contract when none is given).

    A contract with a ``service`` section is served over HTTP: the factory opens
    triloop's client of the protocol, which checks the service (``served_environment``
    is that factory for a served task no installed environment is named after).
    """

    def factory(
        contract: EnvironmentContract | None = None, *, sandbox: SandboxBackend | None = None
    ) -> Environment:
        bound = contract or load_builtin_contract(name)
        if bound.task != name:
            raise ValueError(f"contract is for {bound.task!r}, not {name!r}")
        if bound.service is not None:
            return ServiceEnvironment(bound, sandbox=sandbox)
        entry = _builtin(name)
        check_contract(bound)
        return entry.build(bound, sandbox=sandbox)

    _builtin(name)  # an unknown name or a broken plugin says so now, not at the first episode
    return factory


def served_environment(
    contract: EnvironmentContract | None = None, *, sandbox: SandboxBackend | None = None
) -> Environment:
    """The environment of a contract with a ``service`` section (``EnvironmentFactory``)."""
    if contract is None or contract.service is None:
        raise ValueError("served_environment needs a contract with a service section")
    return ServiceEnvironment(contract, sandbox=sandbox)


def make_environment(
    contract: EnvironmentContract, *, sandbox: SandboxBackend | None = None
) -> Environment:
    """The environment a contract names, bound to it."""
    if contract.service is not None:
        return ServiceEnvironment(contract, sandbox=sandbox)
    return get_environment(contract.task)(contract, sandbox=sandbox)


def reference_solution(
    env_name: str, seed: int, contract: EnvironmentContract | None = None,
    *, item: Mapping[str, Any] | None = None,
) -> list[str]:
    """Scripted optimal actions for the task (admission's k-of-k check, tests)."""
    if contract is not None and contract.service is not None:
        return service.reference_solution(seed, contract, item=item)
    entry = _builtin(env_name)
    bound = contract or load_builtin_contract(env_name)
    if item is None:  # a plugin written before items existed takes (seed, contract)
        return entry.reference(seed, bound)
    return entry.reference(seed, bound, item=item)


def default_describe(
    env: Environment, seed: int, item: Mapping[str, Any] | None
) -> TaskContent:
    """A task's content when its environment gives no ``describe``: the initial
    observation and the state fingerprint after a reset with (seed, item)."""
    try:
        observation = reset_task(env, seed, item)
        state = env.state_fingerprint()
    finally:
        env.close()
    return TaskContent({"environment": env.contract.task, "observation": observation,
                        "state": state})


def describe_task(
    contract: EnvironmentContract, seed: int, item: Mapping[str, Any] | None = None,
    *, factory: EnvironmentFactory | None = None,
) -> TaskContent:
    """What a task is: its environment's ``describe``, or ``default_describe`` (also for an
    environment the registry does not know, when ``factory`` builds it)."""
    entry = None
    if contract.service is None:
        try:
            entry = _builtin(contract.task)
        except UnknownEnvironmentError:
            if factory is None:
                raise
    if entry is not None and entry.describe is not None:
        return entry.describe(seed, item, contract)
    build = factory or (served_environment if contract.service is not None
                        else get_environment(contract.task))
    return default_describe(build(contract), seed, item)


def has_generator(name: str) -> bool:
    """Whether the environment is a procedural source of tasks (``generate``)."""
    return _builtin(name).generate is not None


def generate_tasks(
    contract: EnvironmentContract, params: Mapping[str, Any]
) -> Iterator[GeneratedTask]:
    """The environment's generated tasks for ``params`` (which must name ``count``)."""
    generate = None if contract.service is not None else _builtin(contract.task).generate
    if generate is None:
        raise ValueError(f"environment {contract.task} has no generator: register its tasks "
                         "from a dataset or a list of seeds")
    count = params.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"generator params need a positive integer count, got {count!r}")
    return generate(params, contract)
