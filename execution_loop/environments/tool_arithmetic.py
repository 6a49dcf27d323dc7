"""Tool-using arithmetic in the manner of ToRL: seeded problems, a Python tool, exact answers.

Each turn the model writes either ``python: <code>`` (or a fenced python block), which
runs in the sandbox with the output returned as the next observation, or
``answer: <integer>``, which ends the episode. The verifier regenerates the problem
from the seed and compares the answer exactly; nothing the code printed counts. A
memory bomb or an endless loop in the code ends the episode as failed(sandbox_limit).

Stdlib only at run time (the verifier imports this module without site-packages).
"""

from __future__ import annotations

import random
import re
import sys
import textwrap
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from execution_loop.environments.base import (
    EnvironmentStateError,
    Outcome,
    StepResult,
    TaskCapabilities,
    TaskContent,
    fingerprint,
    refuse_item,
)
from execution_loop.sandbox import SandboxBackend, SandboxLimits
from execution_loop.sandboxes import default_sandbox
from execution_loop.verification import VerifierRequest, run_verifier

if TYPE_CHECKING:
    from triloop.contracts import EnvironmentContract

VERIFIER = "execution_loop.environments.tool_arithmetic:verify"
INSTRUCTIONS = "Reply 'python: <code>' to run Python, or 'answer: <integer>'."
CAPABILITIES = TaskCapabilities(
    actions=frozenset({"run_python", "answer"}),
    observations=frozenset({"problem", "stdout", "stderr", "exit_code"}),
    success_criteria=frozenset({"exact_answer"}),
    outcome_terms=frozenset({"success", "failure"}),
    process_terms=frozenset({"valid_action", "invalid_action", "tool_call"}),
    initial_state={"digits": (int,)},
)
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_INTEGER = re.compile(r"^-?\d+$")


@dataclass(frozen=True)
class Problem:
    """A seeded problem, the Python expression that solves it and its answer."""

    text: str
    expression: str
    answer: int


def _templates(rng: random.Random, digits: int) -> list[Callable[[], Problem]]:
    def n(scale: int = 1) -> int:
        return rng.randint(10 ** (digits - 1), 10**digits - 1) * scale

    def product_plus() -> Problem:
        a, b, c = n(), n(), n()
        return Problem(f"What is {a} * {b} + {c}?", f"{a} * {b} + {c}", a * b + c)

    def difference_of_products() -> Problem:
        a, b, c, d = n(), n(), n(), n()
        return Problem(f"What is {a} * {b} - {c} * {d}?", f"{a} * {b} - {c} * {d}", a * b - c * d)

    def crates() -> Problem:
        a, b = n(), rng.randint(12, 48)
        c = rng.randint(1, a * b - 1)
        text = (
            f"A warehouse holds {a} crates with {b} bottles in each. "
            f"{c} bottles are shipped. How many bottles are left?"
        )
        return Problem(text, f"{a} * {b} - {c}", a * b - c)

    def remainder() -> Problem:
        a, b = n(100), n()
        return Problem(f"What is the remainder when {a} is divided by {b}?", f"{a} % {b}", a % b)

    def range_sum() -> Problem:
        a = n()
        b = a + n()
        text = f"What is the sum of all integers from {a} to {b} inclusive?"
        return Problem(text, f"sum(range({a}, {b} + 1))", (a + b) * (b - a + 1) // 2)

    return [product_plus, difference_of_products, crates, remainder, range_sum]


def generate_problem(seed: int, digits: int = 3) -> Problem:
    """The seed's problem; answers are computed here, never by the agent's code."""
    if not 1 <= digits <= 6:
        raise ValueError(f"tool_arithmetic needs 1 <= digits <= 6, got {digits}")
    rng = random.Random(f"tool_arithmetic/{digits}/{seed}")  # str seeds are stable
    return rng.choice(_templates(rng, digits))()


def parse_action(text: str) -> tuple[str, str] | None:
    """``('answer', value)``, ``('run_python', code)`` or None for anything else."""
    stripped = text.strip()
    head = stripped[:7].lower()
    if head == "answer:":
        return "answer", stripped[7:].strip()
    if head == "python:":
        return "run_python", textwrap.dedent(stripped[7:].strip("\n")).strip()
    fenced = _FENCE.search(stripped)
    return ("run_python", fenced.group(1).strip()) if fenced else None


def normalise_answer(text: str) -> str | None:
    """``' 1,234. '`` -> ``'1234'``; None when it is not an integer."""
    value = text.strip().strip("$").rstrip(".").replace(",", "").replace(" ", "")
    return str(int(value)) if _INTEGER.match(value) else None


class ToolArithmetic:
    """The tool-using arithmetic environment bound to a contract."""

    def __init__(
        self, contract: EnvironmentContract, *, sandbox: SandboxBackend | None = None
    ) -> None:
        self.contract = contract
        # Bubblewrap: the agent's code sees no network, host or verifier files (fails closed).
        allowed = contract.network.endpoints if contract.network else None
        self._sandbox = sandbox or default_sandbox(
            endpoints=allowed, allow_unisolated=contract.allows_unisolated)
        self._digits = int(contract.initial_state.get("digits", 3))
        spec = contract.sandbox
        self._limits = SandboxLimits(
            cpu_time_s=spec.cpu_time_s,
            memory_bytes=spec.memory_mb * 2**20,
            wall_time_s=spec.wall_time_s,
            max_output_bytes=spec.max_output_bytes,
        )
        self._problem: Problem | None = None
        self._seed = 0
        self._turn = 0
        self._done = False
        self._answer: str | None = None
        self._ended_by: str | None = None
        self._observation = ""
        self._deadline = 0.0

    @property
    def sandbox_backend(self) -> SandboxBackend:
        """Where the agent's code runs (recorded with each episode)."""
        return self._sandbox

    def reset(self, seed: int, item: Mapping[str, Any] | None = None) -> str:
        """Start an episode on the seed's problem."""
        refuse_item("tool_arithmetic", item)
        self._problem = generate_problem(seed, self._digits)
        self._seed, self._turn, self._done = seed, 0, False
        self._answer, self._ended_by = None, None
        self._deadline = time.monotonic() + self.contract.limits.wall_time_s
        self._observation = f"{self._problem.text}\n{INSTRUCTIONS}"
        return self._observation

    def step(self, action: str) -> StepResult:
        """Run code in the sandbox or take the final answer."""
        self._require_running()
        self._turn += 1
        parsed = parse_action(action)
        terms = self.contract.reward.process
        feedback: dict[str, Any] = {"valid_action": False, "action": None}
        reward = terms.get("invalid_action", 0.0)
        if parsed is None or parsed[0] not in self.contract.allowed_actions:
            allowed = " or ".join(self.contract.allowed_actions)
            observation = f"invalid action: expected {allowed}. {INSTRUCTIONS}"
        elif parsed[0] == "answer":
            feedback.update(valid_action=True, action="answer")
            reward = terms.get("valid_action", 0.0)
            self._answer, self._ended_by, self._done = parsed[1], "answer", True
            observation = f"answer recorded: {parsed[1]}"
        else:
            feedback.update(valid_action=True, action="run_python")
            reward = terms.get("valid_action", 0.0) + terms.get("tool_call", 0.0)
            observation = self._run_python(parsed[1], feedback)
        if not self._done and self._turn >= self.contract.limits.max_turns:
            self._ended_by, self._done = "max_turns", True
        if not self._done and time.monotonic() > self._deadline:
            self._ended_by, self._done = "wall_time", True
        feedback["ended_by"] = self._ended_by
        # The episode runner reads these two keys to label how the episode ended.
        feedback["failure"] = "sandbox_limit" if self._ended_by == "sandbox_limit" else None
        truncated = self._ended_by in ("max_turns", "wall_time")
        feedback["truncated"] = self._ended_by if truncated else None
        self._observation = observation
        return StepResult(observation, reward, self._done, feedback)

    def _run_python(self, code: str, feedback: dict[str, Any]) -> str:
        command = [sys.executable, "-I", "-S", "-B", "-"]
        result = self._sandbox.run(command, limits=self._limits, stdin=code)
        feedback.update(exit_code=result.exit_code, sandbox_limit=result.limit_exceeded)
        if result.limit_exceeded:
            self._ended_by, self._done = "sandbox_limit", True
            return f"sandbox limit exceeded: {result.limit_exceeded}"
        shown = self.contract.observations
        parts = [f"exit_code: {result.exit_code}"] if "exit_code" in shown else []
        if "stdout" in shown:
            parts.append(f"stdout:\n{result.stdout.rstrip()}")
        if "stderr" in shown and result.stderr.strip():
            parts.append(f"stderr:\n{result.stderr.rstrip()}")
        return "\n".join(parts)

    def verifier_request(self) -> VerifierRequest:
        """What the verifier needs: the seed and the answer text, not the transcript."""
        if self._problem is None:
            raise EnvironmentStateError("call reset(seed) first")
        payload = {
            "seed": self._seed,
            "digits": self._digits,
            "answer": self._answer,
            "ended_by": self._ended_by,
            "reward": dict(self.contract.reward.outcome),
        }
        return VerifierRequest(VERIFIER, payload)

    def outcome(self) -> Outcome:
        """Verified in a separate process against the regenerated problem."""
        return run_verifier(self.verifier_request(), sandbox=self._sandbox)

    def state_fingerprint(self) -> str:
        """sha256 of the last observation, the turn and whether the episode is over."""
        if self._problem is None:
            raise EnvironmentStateError("call reset(seed) first")
        state = {"observation": self._observation, "turn": self._turn, "done": self._done}
        return fingerprint(state)

    def close(self) -> None:
        """Nothing to release: each code run had its own removed folder."""
        self._problem = None

    def _require_running(self) -> None:
        if self._problem is None:
            raise EnvironmentStateError("call reset(seed) first")
        if self._done:
            raise EnvironmentStateError("the episode is over; call reset(seed) to start another")


def verify(payload: dict[str, Any]) -> Outcome:
    """Exact comparison of the recorded answer with the regenerated problem's answer."""
    problem = generate_problem(int(payload["seed"]), int(payload["digits"]))
    raw = payload.get("answer")
    given = normalise_answer(str(raw)) if raw is not None else None
    success = given is not None and given == str(problem.answer)
    if success:
        reason = "correct"
    elif payload.get("ended_by") == "sandbox_limit":
        reason = "sandbox_limit"
    else:
        reason = "no_answer" if raw is None else "wrong_answer"
    terms: dict[str, float] = payload["reward"]
    reward = terms["success"] if success else terms.get("failure", 0.0)
    details = {"reason": reason, "given": given, "expected": str(problem.answer)}
    return Outcome(success=success, reward=float(reward), details=details)


def describe(
    seed: int, item: Mapping[str, Any] | None, contract: EnvironmentContract
) -> TaskContent:
    """The task is its problem text and answer (two seeds drawing the same problem are
    one task)."""
    refuse_item("tool_arithmetic", item)
    digits = int(contract.initial_state.get("digits", 3))
    problem = generate_problem(seed, digits)
    return TaskContent(
        {"environment": "tool_arithmetic", "problem": problem.text,
         "answer": str(problem.answer)},
        {"digits": str(digits)},
    )


def reference_solution(
    seed: int, contract: EnvironmentContract, item: Mapping[str, Any] | None = None
) -> list[str]:
    """Compute with the tool, then answer."""
    refuse_item("tool_arithmetic", item)
    problem = generate_problem(seed, int(contract.initial_state.get("digits", 3)))
    return [f"python: print({problem.expression})", f"answer: {problem.answer}"]
