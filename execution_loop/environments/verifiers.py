"""Environments of the ``verifiers`` library (the ones prime-rl trains on), played by triloop.

The contract names a verifiers taskset package (``initial_state.taskset``, a top-level
importable module exporting its ``Taskset`` through ``__all__``, and optionally an
``Env``), its config arguments (``initial_state.args``, a JSON object) and an optional
``Env`` package to pair with it (``initial_state.env``). Folders listed under the contract's
``fixtures`` go first on the import path, so a taskset shipped with the contract is part of
the version's identity (its bytes are fixture hashes). verifiers' own loader builds it.

A task is one row of the taskset: its ``item`` is the row's data (``prompt``, ``answer``,
whatever fields its ``TaskData`` declares); a task without an item plays the row at
position ``seed``. ``verifiers_play`` runs the environment's ``Env.run`` a reply at a time:
a single-turn environment asks once, a multi-turn one answers each reply (its environment
side of the conversation) until its own completion rule ends the episode or the contract's
``max_turns`` is reached. Every turn is one ``reply`` action: the model's whole text.

The verdict is the taskset's rubric (its ``@vf.reward`` functions, weighted, and the
environment's ``finalize``), computed in the verifier process by replaying the recorded
replies against a freshly loaded environment. ``success`` is a rubric reward of at least
``initial_state.success_reward``; the outcome reward is ``rubric`` times the rubric's reward
plus the ``success``/``failure`` term. A rubric that calls a judge model cannot run there
(the verifier has no network): write rewards as code.

This module is stdlib-only at import; ``verifiers`` is imported where it is used.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from execution_loop.environments.base import (
    EnvironmentStateError,
    GeneratedTask,
    Outcome,
    StepResult,
    TaskCapabilities,
    TaskContent,
    fingerprint,
)
from execution_loop.verification import VerifierRequest, run_verifier

if TYPE_CHECKING:
    from execution_loop.environments.verifiers_play import Play, PlaySpec
    from execution_loop.sandbox import SandboxBackend
    from triloop.contracts import EnvironmentContract

VERIFIER = "execution_loop.environments.verifiers:verify"
# The verifier process may import these installed distributions (and their requirements).
# cryptography is named because mcp requires ``pyjwt[crypto]`` and the requirement walk
# follows names, not the extras a requirement asks for.
VERIFIER_DISTRIBUTIONS = ("verifiers", "cryptography")
CAPABILITIES = TaskCapabilities(
    actions=frozenset({"reply"}),
    observations=frozenset({"prompt", "env_response"}),
    success_criteria=frozenset({"goal_reached"}),
    outcome_terms=frozenset({"success", "failure", "rubric"}),
    process_terms=frozenset({"valid_action"}),
    initial_state={
        "taskset": (str,),
        "args": (str,),
        "env": (str,),
        "success_reward": (int, float),
    },
    required_state=frozenset({"taskset"}),
)


def spec_of(contract: EnvironmentContract) -> PlaySpec:
    """Which verifiers environment the contract names, with its fixture folders first."""
    from execution_loop.environments.verifiers_play import PlaySpec

    state = contract.initial_state
    paths = []
    for relative in contract.fixtures:
        folder = contract.fixture_path(relative)
        if folder.is_dir():
            paths.append(str(folder.resolve()))
    args = str(state.get("args", "{}"))
    try:
        parsed = json.loads(args)
    except ValueError as exc:
        raise ValueError(f"verifiers contract {contract.task}: initial_state.args is not "
                         f"JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ValueError(f"verifiers contract {contract.task}: initial_state.args must be a "
                         "JSON object")
    canonical = json.dumps(parsed, sort_keys=True)
    return PlaySpec(str(state["taskset"]), canonical, str(state.get("env", "")), tuple(paths))


def _payload_spec(spec: PlaySpec) -> dict[str, Any]:
    return {"taskset": spec.taskset, "args": spec.args, "env": spec.env,
            "paths": list(spec.paths)}


class VerifiersEnvironment:
    """A verifiers environment bound to a contract; one episode at a time."""

    def __init__(
        self, contract: EnvironmentContract, *, sandbox: SandboxBackend | None = None
    ) -> None:
        self.contract = contract
        self._sandbox = sandbox  # used only to run the verifier
        from execution_loop.environments.verifiers_play import load, seat_of

        self._spec = spec_of(contract)
        seat_of(load(self._spec))  # a taskset that does not load, or two seats: say so now
        self._play: Play | None = None
        self._seed = 0
        self._item: dict[str, Any] | None = None
        self._actions: list[str] = []
        self._observation = ""
        self._ended_by: str | None = None

    def reset(self, seed: int, item: Mapping[str, Any] | None = None) -> str:
        """Start an episode on the item's row (the seed's row without one)."""
        from execution_loop.environments.verifiers_play import Play

        self.close()
        self._seed, self._actions, self._ended_by = seed, [], None
        self._item = dict(item) if item is not None else None
        self._play = Play(self._spec, seed, self._item, max_turns=self.contract.limits.max_turns)
        if self._play.done:
            raise EnvironmentStateError(f"verifiers environment {self._spec.taskset!r} ended "
                                        "before asking for a reply")
        self._observation = self._play.observation
        return self._observation

    def step(self, action: str) -> StepResult:
        """The model's reply; the environment's next message, or the episode's end."""
        play = self._require_running()
        self._actions.append(action)
        play.send(action)
        terms = self.contract.reward.process
        feedback: dict[str, Any] = {"valid_action": True, "action": "reply"}
        if play.done:
            self._ended_by = play.trace.stop_condition
            self._observation = "episode over"
        else:
            self._observation = play.observation
        truncated = self._ended_by == "max_turns"
        feedback.update(ended_by=self._ended_by, failure=None,
                        truncated="max_turns" if truncated else None)
        return StepResult(self._observation, terms.get("valid_action", 0.0), play.done, feedback)

    def verifier_request(self) -> VerifierRequest:
        """The row, the replies as written and the rubric's terms: no observation."""
        if self._play is None and not self._actions:
            raise EnvironmentStateError("call reset(seed) first")
        payload = {
            **_payload_spec(self._spec),
            "seed": self._seed,
            "item": self._item,
            "actions": list(self._actions),
            "max_turns": self.contract.limits.max_turns,
            "success_reward": float(self.contract.initial_state.get("success_reward", 1.0)),
            "reward": dict(self.contract.reward.outcome),
        }
        return VerifierRequest(VERIFIER, payload)

    def outcome(self) -> Outcome:
        """The rubric, run in the verifier process on a replay of the replies."""
        return run_verifier(self.verifier_request(), sandbox=self._sandbox)

    def state_fingerprint(self) -> str:
        """sha256 of the last observation, the turn and whether the episode is over."""
        if self._play is None:
            raise EnvironmentStateError("call reset(seed) first")
        state = {"observation": self._observation, "turn": len(self._actions),
                 "done": self._play.done}
        return fingerprint(state)

    def close(self) -> None:
        """Stop an unfinished episode's coroutine."""
        if self._play is not None:
            self._play.close()

    def _require_running(self) -> Play:
        if self._play is None:
            raise EnvironmentStateError("call reset(seed) first")
        if self._play.done:
            raise EnvironmentStateError("the episode is over; call reset(seed) to start another")
        return self._play


def verify(payload: dict[str, Any]) -> Outcome:
    """Replay the replies against a fresh environment; the taskset's rubric judges."""
    from execution_loop.environments.verifiers_play import PlaySpec, replay

    spec = PlaySpec(str(payload["taskset"]), str(payload["args"]), str(payload["env"]),
                    tuple(str(p) for p in payload["paths"]))
    actions = [str(a) for a in payload["actions"]]
    scored = replay(spec, int(payload["seed"]), payload.get("item"), actions,
                    max_turns=int(payload["max_turns"]))
    success = scored.reward >= float(payload["success_reward"])
    terms: dict[str, float] = payload["reward"]
    reward = terms.get("rubric", 0.0) * scored.reward + (
        terms["success"] if success else terms.get("failure", 0.0))
    details = {
        "rubric_reward": scored.reward,
        "rewards": scored.rewards,
        "metrics": scored.metrics,
        "stop_condition": scored.stop_condition,
        "turns": scored.turns,
        "reason": "correct" if success else ("no_reply" if not actions else "rubric_below"),
    }
    return Outcome(success=success, reward=float(reward), details=details)


def _row(seed: int, item: Mapping[str, Any] | None, contract: EnvironmentContract,
         ) -> dict[str, Any]:
    from execution_loop.environments.verifiers_play import row_of, task_for

    return dict(item) if item is not None else row_of(task_for(spec_of(contract), seed, None))


def reference_solution(
    seed: int, contract: EnvironmentContract, *, item: Mapping[str, Any] | None = None
) -> list[str]:
    """Reply with the row's answer (a multi-turn environment's first reply is right)."""
    row = _row(seed, item, contract)
    if row.get("answer") in (None, ""):
        raise ValueError(f"verifiers row {seed} has no answer to play as its reference")
    return [str(row["answer"])]


def describe(
    seed: int, item: Mapping[str, Any] | None, contract: EnvironmentContract
) -> TaskContent:
    """What the agent sees and the rubric checks: the taskset and the whole row (prompt,
    answer, info); tags are the string values of the row's ``info``."""
    row = _row(seed, item, contract)
    info = row.get("info")
    tags = ({str(k): v for k, v in info.items() if isinstance(v, str)}
            if isinstance(info, dict) else {})
    return TaskContent({"taskset": str(contract.initial_state["taskset"]), "row": row}, tags)


def generate(params: Mapping[str, Any], contract: EnvironmentContract) -> Iterator[GeneratedTask]:
    """The taskset's first ``count`` rows, each a task whose item is the row."""
    from execution_loop.environments.verifiers_play import rows

    count = int(params["count"])
    if count < 1:
        raise ValueError(f"verifiers generator needs count >= 1, got {count}")
    for ordinal, row in enumerate(rows(spec_of(contract), count)):
        tags = dict(describe(ordinal, row, contract).tags)
        yield GeneratedTask(seed=ordinal, item=row, tags=tags)
