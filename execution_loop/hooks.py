"""Lifecycle hooks: checks a contract adds to every episode without editing triloop.

A contract's ``hooks`` section names functions by ``module:function`` reference, in
``execution_loop`` or in an installed environment plugin's package (the rule verifiers
follow); their modules are part of the version's code hashes. The episode runner calls

- ``before_reset(contract, seed)`` before each reset;
- ``after_step(contract, index, action_text, result)`` after each step; a mapping it
  returns is stored in the step's ``feedback["hooks"]``;
- ``after_episode(contract, summary)`` before the verdict is asked for; ``summary`` is
  ``{"status", "failure_reason", "steps", "actions"}``; a mapping it returns is stored in
  the outcome's details under ``"hooks"``.

A hook refuses by raising ``HookRefusal``: the episode ends ``failed`` with the reason
``hook <name>: <message>`` and no verdict. Any other exception from a hook is the hook's
bug and ends the episode the same way, named as such.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from triloop.environment_code import plugin_search_path

if TYPE_CHECKING:
    from triloop.contracts import EnvironmentContract

HOOK_PACKAGE = "execution_loop."


class HookRefusal(Exception):
    """Raised by a hook to fail the episode, with a reason a person can act on."""


class HookFailed(RuntimeError):
    """A hook refused (or crashed); ``reason`` is what the episode's record says."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def resolve_hook(reference: str) -> Callable[..., Any]:
    """Import a hook by ``module:function``; only our package or an installed plugin's."""
    module, _, function = reference.partition(":")
    if not function.isidentifier() or not (
        module.startswith(HOOK_PACKAGE) or plugin_search_path(module)
    ):
        raise ValueError(
            f"hook {reference!r} must be 'module:function' in execution_loop or "
            "an installed environment plugin's package"
        )
    target = getattr(importlib.import_module(module), function)
    if not callable(target):
        raise TypeError(f"hook {reference} is not callable")
    return target  # type: ignore[no-any-return]


@dataclass(frozen=True)
class EpisodeHooks:
    """The contract's hooks, imported once per environment."""

    contract: EnvironmentContract | None = None
    before_reset: list[tuple[str, Callable[..., Any]]] = field(default_factory=list)
    after_step: list[tuple[str, Callable[..., Any]]] = field(default_factory=list)
    after_episode: list[tuple[str, Callable[..., Any]]] = field(default_factory=list)

    @classmethod
    def of(cls, contract: EnvironmentContract | None) -> EpisodeHooks:
        spec = getattr(contract, "hooks", None)
        if contract is None or spec is None:
            return cls(contract)
        return cls(
            contract,
            [(r, resolve_hook(r)) for r in spec.before_reset],
            [(r, resolve_hook(r)) for r in spec.after_step],
            [(r, resolve_hook(r)) for r in spec.after_episode],
        )

    def _call(
        self, stage: str, hooks: list[tuple[str, Callable[..., Any]]], *args: Any
    ) -> dict[str, Any]:
        notes: dict[str, Any] = {}
        for reference, hook in hooks:
            try:
                returned = hook(self.contract, *args)
            except HookRefusal as refusal:
                raise HookFailed(f"hook {reference} ({stage}): {refusal}") from refusal
            except Exception as exc:  # a hook's bug fails its episode, named
                raise HookFailed(
                    f"hook {reference} ({stage}) crashed: {type(exc).__name__}: {exc}"
                ) from exc
            if isinstance(returned, Mapping):
                notes[reference] = dict(returned)
        return notes

    def run_before_reset(self, seed: int) -> None:
        self._call("before_reset", self.before_reset, seed)

    def run_after_step(self, index: int, action: str, result: Any) -> dict[str, Any]:
        return self._call("after_step", self.after_step, index, action, result)

    def run_after_episode(self, summary: Mapping[str, Any]) -> dict[str, Any]:
        return self._call("after_episode", self.after_episode, dict(summary))
