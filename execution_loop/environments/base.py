"""The interface every environment implements, and the plain data it returns.

Stdlib only at run time: verifiers import the environment modules in an interpreter
without site-packages, so the contract type is imported for type checking only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from execution_loop.sandbox import SandboxBackend
    from triloop.contracts import EnvironmentContract


@dataclass(frozen=True)
class StepResult:
    """What one agent turn produced."""

    observation: str  # next text the agent sees
    reward: float  # process reward for this step (0.0 if none)
    done: bool
    # JSON-serialisable, stored with the step. ``feedback["reward_terms"]`` MAY name the
    # process terms ``reward`` is made of, ``{term: value}`` summing to it (frozen_lake's
    # ``valid_action``/``invalid_action``): the gates split a gain by term (``REWARD_TERMS``).
    feedback: dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    """The verifier's verdict on an episode."""

    success: bool
    reward: float  # outcome reward per the contract
    # ``details["reward_terms"]`` MAY name the contract's outcome terms ``reward`` is made of,
    # ``{term: value}`` summing to it (``success``, ``failure``, ``progress``, ...).
    details: dict[str, Any]


# Where a step's ``feedback`` and an outcome's ``details`` name the terms of their reward.
# The verifier adds them up per episode (``verdict.details["terms"]``); reward it finds
# unnamed goes to ``process`` (steps) or to ``success``/``outcome`` (the outcome), so an
# environment that does not split its reward still gets a truthful, if coarse, split.
REWARD_TERMS = "reward_terms"


class Environment(Protocol):
    """A multi-turn environment bound to one contract; one episode at a time."""

    contract: EnvironmentContract

    def reset(self, seed: int, item: Mapping[str, Any] | None = None) -> str:
        """Start an episode; the same seed (and item) gives the same initial observation.

        ``item`` is the task's dataset row or generated problem (``task.item``); an
        environment whose tasks the seed alone makes refuses one (``refuse_item``).
        """
        ...

    def step(self, action: str) -> StepResult:
        """Apply the model's raw text for one turn."""
        ...

    def outcome(self) -> Outcome:
        """Ask the verifier, in its own process, how the episode ended."""
        ...

    def state_fingerprint(self) -> str:
        """sha256 of the observable state (admission checks reproducibility with it)."""
        ...

    def close(self) -> None:
        """Release working copies and other resources."""
        ...


class EnvironmentFactory(Protocol):
    """Builds an environment for a contract (the built-in one when omitted)."""

    def __call__(
        self,
        contract: EnvironmentContract | None = None,
        *,
        sandbox: SandboxBackend | None = None,
    ) -> Environment: ...


@dataclass(frozen=True)
class TaskCapabilities:
    """What an environment implementation understands, to check a contract against.

    ``initial_state`` maps each parameter to the Python types it accepts.
    """

    actions: frozenset[str]
    observations: frozenset[str]
    success_criteria: frozenset[str]
    outcome_terms: frozenset[str]
    process_terms: frozenset[str]
    initial_state: Mapping[str, tuple[type, ...]] = field(default_factory=dict)
    required_state: frozenset[str] = frozenset()


@dataclass(frozen=True)
class TaskContent:
    """What a task *is*: what the agent sees and what the verifier checks.

    ``content`` is JSON-serialisable (a rendered initial state, fixture bytes' digests,
    the answer); its ``fingerprint`` is the task's content digest, so two tasks with equal
    content are the same task whatever their seeds. ``tags`` are the environment's own
    (domain, capability, difficulty, ...), merged under a task set's declared tags.
    """

    content: Mapping[str, Any]
    tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        """sha256 of the content (``fingerprint``)."""
        return fingerprint(self.content)


@dataclass(frozen=True)
class GeneratedTask:
    """One task a generator made: its seed, its item (None: the seed alone) and tags."""

    seed: int
    item: dict[str, Any] | None = None
    tags: dict[str, str] = field(default_factory=dict)


class Describe(Protocol):
    """An environment's ``describe(seed, item, contract) -> TaskContent``."""

    def __call__(
        self, seed: int, item: Mapping[str, Any] | None, contract: EnvironmentContract
    ) -> TaskContent: ...


class Generate(Protocol):
    """An environment's ``generate(params, contract)``; ``params`` always has ``count``."""

    def __call__(
        self, params: Mapping[str, Any], contract: EnvironmentContract
    ) -> Iterator[GeneratedTask]: ...


class EnvironmentUnavailable(RuntimeError):
    """What backs an environment (its service) cannot be reached: infrastructure, retried."""


class EnvironmentStateError(RuntimeError):
    """An environment was used out of order (step before reset, step after done)."""


def fingerprint(state: Mapping[str, Any]) -> str:
    """sha256 of a JSON-serialisable state, independent of key order."""
    blob = json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def reset_task(env: Environment, seed: int, item: Mapping[str, Any] | None) -> str:
    """Reset ``env`` on a task: with its item when it has one (an environment written
    before items existed, whose tasks have none, is still called as ``reset(seed)``)."""
    return env.reset(seed) if item is None else env.reset(seed, item)


def refuse_item(environment: str, item: Mapping[str, Any] | None) -> None:
    """Raise ``ValueError`` for an item given to an environment whose seed makes the task."""
    if item is not None:
        raise ValueError(f"{environment} takes no item: its seed alone makes the task "
                         f"(got an item with keys {sorted(item)})")
