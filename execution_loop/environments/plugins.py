"""Environments from installed packages: the ``triloop.environments`` entry-point group.

A package outside triloop provides an environment by declaring, in its own
``pyproject.toml``::

    [project.entry-points."triloop.environments"]
    letter_count = "letter_env.environment:LetterCount"

The entry point's name is the contract's ``task``; it names the environment class.
The class's module has the same shape as a built-in environment module:

- ``CAPABILITIES``: a ``TaskCapabilities`` (contracts are checked against it);
- ``VERIFIER``: ``"package.module:function"``, run in triloop's verifier process (a
  fresh interpreter without site-packages, with the package's folder on its path), so
  the verifier module imports only the standard library and ``execution_loop``, and the
  installed distributions it names in ``VERIFIER_DISTRIBUTIONS`` (with their
  requirements; their files count in the verifier hash and the version's code hashes);
- ``reference_solution(seed, contract, item=None) -> list[str]``: the admission probe's
  k-of-k run;
- optionally ``describe(seed, item, contract) -> TaskContent`` (what a task is: its
  content digest and tags; without it the initial observation after a reset), and
  ``generate(params, contract) -> Iterator[GeneratedTask]`` (a procedural task source a
  task set can be registered from).

A plugin may not take a built-in's name, and one that fails to load or lacks a piece
is reported by name (``PluginError``) rather than silently left out.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Any

from execution_loop.environments.base import (
    Describe,
    Environment,
    Generate,
    TaskCapabilities,
)
from triloop.environment_code import PLUGIN_GROUP

__all__ = ["PLUGIN_GROUP", "PluginEnvironment", "PluginError", "installed_plugins", "load_plugin"]


class PluginError(RuntimeError):
    """An installed environment plugin that cannot be used, and why."""


@dataclass(frozen=True)
class PluginEnvironment:
    """One loaded plugin: its class, capabilities, verifier and reference solution."""

    name: str
    distribution: str
    build: Callable[..., Environment]
    capabilities: TaskCapabilities
    verifier: str
    reference: Callable[..., list[str]]  # (seed, contract, item=None)
    describe: Describe | None = None
    generate: Generate | None = None


def installed_plugins() -> dict[str, metadata.EntryPoint]:
    """Entry points of the group by name (nothing imported yet)."""
    found: dict[str, metadata.EntryPoint] = {}
    for entry in metadata.entry_points(group=PLUGIN_GROUP):
        if entry.name in found and found[entry.name].value != entry.value:
            raise PluginError(
                f"two installed packages provide environment {entry.name!r}: "
                f"{found[entry.name].value} and {entry.value}"
            )
        found[entry.name] = entry
    return found


def _required(module: ModuleType, name: str, kind: type | None, entry: str) -> Any:
    value = getattr(module, name, None)
    if value is None or (kind is not None and not isinstance(value, kind)):
        what = kind.__name__ if kind is not None else "callable"
        raise PluginError(f"environment plugin {entry}: module {module.__name__} needs {name} "
                          f"({what})")
    return value


def load_plugin(entry: metadata.EntryPoint) -> PluginEnvironment:
    """Import one entry point's class and check its module has every piece."""
    try:
        build = entry.load()
    except Exception as exc:  # any import error of someone else's package: say whose
        raise PluginError(f"environment plugin {entry.name} ({entry.value}) failed to load: "
                          f"{type(exc).__name__}: {exc}") from exc
    if not callable(build):
        raise PluginError(f"environment plugin {entry.name}: {entry.value} is not a class")
    module = importlib.import_module(entry.module)
    capabilities = _required(module, "CAPABILITIES", TaskCapabilities, entry.value)
    verifier = _required(module, "VERIFIER", str, entry.value)
    reference = _required(module, "reference_solution", None, entry.value)
    if not callable(reference):
        raise PluginError(f"environment plugin {entry.value}: reference_solution is not callable")
    verifier_module = verifier.partition(":")[0]
    if verifier_module.split(".")[0] != entry.module.split(".")[0]:
        raise PluginError(f"environment plugin {entry.value}: VERIFIER {verifier!r} must live "
                          "in the plugin's own package")
    optional = {}
    for name in ("describe", "generate"):
        value = getattr(module, name, None)
        if value is not None and not callable(value):
            raise PluginError(f"environment plugin {entry.value}: {name} is not callable")
        optional[name] = value
    distribution = entry.dist.name if entry.dist is not None else "?"
    return PluginEnvironment(entry.name, distribution, build, capabilities, verifier, reference,
                             describe=optional["describe"], generate=optional["generate"])
