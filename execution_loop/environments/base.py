"""The interface every environment implements, and the plain data it returns.

Stdlib only at run time: verifiers import the environment modules in an interpreter
without site-packages, so the contract type is imported for type checking only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
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
    feedback: dict[str, Any]  # JSON-serialisable, stored with the step


@dataclass(frozen=True)
class Outcome:
    """The verifier's verdict on an episode."""

    success: bool
    reward: float  # outcome reward per the contract
    details: dict[str, Any]


class Environment(Protocol):
    """A multi-turn environment bound to one contract; one episode at a time."""

    contract: EnvironmentContract

    def reset(self, seed: int) -> str:
        """Start an episode; the same seed gives the same initial observation."""
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


class EnvironmentUnavailable(RuntimeError):
    """What backs an environment (its service) cannot be reached: infrastructure, retried."""


class EnvironmentStateError(RuntimeError):
    """An environment was used out of order (step before reset, step after done)."""


def fingerprint(state: Mapping[str, Any]) -> str:
    """sha256 of a JSON-serialisable state, independent of key order."""
    blob = json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()
