"""``letter_count``: how many times does a letter occur in a seeded word?

The module has the shape triloop asks of an environment plugin: the environment
class (named by the ``triloop.environments`` entry point), ``CAPABILITIES``,
``VERIFIER`` and ``reference_solution``. ``verify`` runs in triloop's verifier
process, which imports only the standard library and ``execution_loop``, so this
module imports nothing else at run time.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from execution_loop.environments.base import (
    EnvironmentStateError,
    Outcome,
    StepResult,
    TaskCapabilities,
    fingerprint,
    refuse_item,
)
from execution_loop.verification import VerifierRequest, run_verifier

if TYPE_CHECKING:
    from execution_loop.sandbox import SandboxBackend
    from triloop.contracts import EnvironmentContract

VERIFIER = "letter_count_env.environment:verify"
CAPABILITIES = TaskCapabilities(
    actions=frozenset({"answer"}),
    observations=frozenset({"question"}),
    success_criteria=frozenset({"exact_answer"}),
    outcome_terms=frozenset({"success", "failure"}),
    process_terms=frozenset({"valid_action", "invalid_action"}),
    initial_state={"word_length": (int,)},
)
_ANSWER = re.compile(r"-?\d+")  # the first integer in the reply is the answer


def puzzle(seed: int, length: int) -> tuple[str, str, int]:
    """The seed's word, letter and count (the verifier calls this too)."""
    rng = random.Random(f"letter_count/{length}/{seed}")
    letters = rng.sample("aeiost", 3)
    word = "".join(rng.choice(letters + list(string.ascii_lowercase[:4])) for _ in range(length))
    letter = rng.choice(letters)
    return word, letter, word.count(letter)


class LetterCount:
    """One episode at a time: a question, then a reply whose first integer is the answer."""

    def __init__(
        self, contract: EnvironmentContract, *, sandbox: SandboxBackend | None = None
    ) -> None:
        self.contract = contract
        self._sandbox = sandbox  # the verifier runs through it (admission records that)
        self._length = int(contract.initial_state.get("word_length", 8))
        self._seed: int | None = None
        self._turn = 0
        self._answer: str | None = None
        self._done = False

    def reset(self, seed: int, item: Mapping[str, Any] | None = None) -> str:
        refuse_item("letter_count", item)  # the seed alone makes the puzzle
        word, letter, _ = puzzle(seed, self._length)
        self._seed, self._turn, self._answer, self._done = seed, 0, None, False
        return f"How many times does '{letter}' occur in '{word}'? Reply 'answer: <n>'."

    def step(self, action: str) -> StepResult:
        if self._seed is None or self._done:
            raise EnvironmentStateError("call reset(seed) before step, and not after the end")
        self._turn += 1
        match = _ANSWER.search(action)
        terms = self.contract.reward.process
        if match:
            self._answer, self._done = match.group(0), True
            return StepResult("answer recorded", terms.get("valid_action", 0.0), True,
                              {"valid_action": True})
        self._done = self._turn >= self.contract.limits.max_turns
        penalty = terms.get("invalid_action", 0.0)
        ended = "max_turns" if self._done else None
        return StepResult("Reply 'answer: <n>'.", penalty, self._done,
                          {"valid_action": False, "truncated": ended})

    def outcome(self) -> Outcome:
        if self._seed is None:
            raise EnvironmentStateError("call reset(seed) first")
        payload = {"seed": self._seed, "word_length": self._length, "answer": self._answer,
                   "reward": dict(self.contract.reward.outcome)}
        return run_verifier(VerifierRequest(VERIFIER, payload), sandbox=self._sandbox)

    def state_fingerprint(self) -> str:
        if self._seed is None:
            raise EnvironmentStateError("call reset(seed) first")
        return fingerprint({"seed": self._seed, "turn": self._turn, "done": self._done})

    def close(self) -> None:
        self._seed = None


def verify(payload: dict[str, Any]) -> Outcome:
    """Regenerate the puzzle from the seed and compare the answer exactly."""
    _, _, count = puzzle(int(payload["seed"]), int(payload["word_length"]))
    success = payload.get("answer") is not None and int(payload["answer"]) == count
    terms: dict[str, float] = payload["reward"]
    reward = terms["success"] if success else terms.get("failure", 0.0)
    return Outcome(success, float(reward), {"expected": count, "given": payload.get("answer")})


def reference_solution(
    seed: int, contract: EnvironmentContract, item: Mapping[str, Any] | None = None
) -> list[str]:
    """The right answer, for admission's repeatability check."""
    _, _, count = puzzle(seed, int(contract.initial_state.get("word_length", 8)))
    return [f"answer: {count}"]
