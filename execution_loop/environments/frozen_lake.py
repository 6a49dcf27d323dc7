"""FrozenLake, a seeded multi-turn grid game in the manner of RAGEN.

The agent (``P``) must reach the goal (``G``) on a small frozen lake without stepping
into a hole (``O``); ``.`` is safe ice. Each turn the model writes one move: ``L``,
``R``, ``U`` or ``D`` (``left``/``right``/``up``/``down`` and any case are accepted).
The map comes from the seed and is always solvable. ``initial_state.layout`` says where
start and goal are: ``random`` (the default) draws both from the seed, at least ``size - 1``
apart; ``corners`` puts the start top-left and the goal bottom-right, as in Gymnasium's
FrozenLake, so only the holes vary with the seed and a policy can learn the way from its
own position. Reaching the goal ends the episode
with success; falling into a hole (shown as ``X``) ends it with failure.

The observation is only the grid, e.g. ``P..O\\n.O..\\n....\\nO..G``, so a tiny
model with a few hundred tokens of vocabulary can learn it. Rewards follow the
contract: process terms ``valid_action``/``invalid_action`` each turn, outcome terms
``success``/``failure`` and an optional ``progress`` share for closing distance to the
goal without falling in, which gives an untrained policy a gradient to follow. Both name
their terms (``reward_terms``), so the gates can tell a gain in goals from one in progress.

Stdlib only at run time (the verifier imports this module without site-packages).
"""

from __future__ import annotations

import random
import re
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from execution_loop.environments.base import (
    REWARD_TERMS,
    EnvironmentStateError,
    Outcome,
    StepResult,
    TaskCapabilities,
    TaskContent,
    fingerprint,
    refuse_item,
)
from execution_loop.verification import VerifierRequest, run_verifier

if TYPE_CHECKING:
    from execution_loop.sandbox import SandboxBackend
    from triloop.contracts import EnvironmentContract

Cell = tuple[int, int]
VERIFIER = "execution_loop.environments.frozen_lake:verify"
MOVES: dict[str, Cell] = {"left": (0, -1), "right": (0, 1), "up": (-1, 0), "down": (1, 0)}
TOKENS = {"left": "L", "right": "R", "up": "U", "down": "D"}
_ALIASES = {**{t.lower(): m for m, t in TOKENS.items()}, **{m: m for m in MOVES}}
CAPABILITIES = TaskCapabilities(
    actions=frozenset(MOVES),
    observations=frozenset({"grid"}),
    success_criteria=frozenset({"goal_reached"}),
    outcome_terms=frozenset({"success", "failure", "progress"}),
    process_terms=frozenset({"valid_action", "invalid_action"}),
    initial_state={"size": (int,), "holes": (int,), "layout": (str,)},
)
LAYOUTS = ("random", "corners")  # where start and goal are; "random" is the default


@dataclass(frozen=True)
class LakeMap:
    """One seeded map."""

    size: int
    start: Cell
    goal: Cell
    holes: frozenset[Cell]


def _distance(a: Cell, b: Cell) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def _move(lake: LakeMap, at: Cell, move: str) -> Cell:
    dr, dc = MOVES[move]
    row, col = at[0] + dr, at[1] + dc
    inside = 0 <= row < lake.size and 0 <= col < lake.size
    return (row, col) if inside else at  # bumping into the edge: stay put


def shortest_path(lake: LakeMap) -> list[str] | None:
    """Moves of a shortest safe path from start to goal (None if there is none)."""
    came: dict[Cell, tuple[Cell, str] | None] = {lake.start: None}
    queue = deque([lake.start])
    while queue:
        cell = queue.popleft()
        if cell == lake.goal:
            path: list[str] = []
            step = came[cell]
            while step is not None:
                path.append(step[1])
                step = came[step[0]]
            return path[::-1]
        for move in MOVES:  # fixed order: the same seed always gives the same path
            nxt = _move(lake, cell, move)
            if nxt not in came and nxt not in lake.holes:
                came[nxt] = (cell, move)
                queue.append(nxt)
    return None


def generate_map(seed: int, size: int = 4, holes: int = 3, layout: str = "random") -> LakeMap:
    """A solvable map from the seed. ``random``: start and goal drawn, at least ``size - 1``
    apart; ``corners``: start (0, 0), goal (size-1, size-1), only the holes drawn."""
    if size < 2 or not 0 <= holes <= size * size - 2:
        raise ValueError(
            f"frozen_lake needs size >= 2 and 0 <= holes <= size^2-2, "
            f"got size={size}, holes={holes}"
        )
    if layout not in LAYOUTS:
        raise ValueError(f"frozen_lake layout must be one of {', '.join(LAYOUTS)}, "
                         f"got {layout!r}")
    # str seeds are stable; the random layout keeps its original seed string, so its maps
    # are the same as before layouts existed.
    name = f"{size}/{holes}/{seed}" if layout == "random" else f"{size}/{holes}/{layout}/{seed}"
    rng = random.Random(f"frozen_lake/{name}")
    cells = [(r, c) for r in range(size) for c in range(size)]
    for _ in range(1000):
        if layout == "corners":
            start, goal = (0, 0), (size - 1, size - 1)
        else:
            start, goal = rng.sample(cells, 2)
        if _distance(start, goal) < size - 1:
            continue
        free = [c for c in cells if c not in (start, goal)]
        lake = LakeMap(size, start, goal, frozenset(rng.sample(free, holes)))
        if shortest_path(lake) is not None:
            return lake
    raise ValueError(f"no solvable {size}x{size} map with {holes} holes for seed {seed}")


def render(lake: LakeMap, at: Cell, fell: bool = False) -> str:
    """The grid as text: P player, G goal, O hole, X player in a hole, . ice."""
    rows = []
    for r in range(lake.size):
        row = ""
        for c in range(lake.size):
            cell = (r, c)
            if cell == at:
                row += "X" if fell else "P"
            else:
                row += "G" if cell == lake.goal else "O" if cell in lake.holes else "."
        rows.append(row)
    return "\n".join(rows)


def parse_move(text: str) -> str | None:
    """The one move the text names (``R``, ``right``, ``Right.``), else None."""
    words = {_ALIASES[w] for w in re.findall(r"[a-z]+", text.lower()) if w in _ALIASES}
    return words.pop() if len(words) == 1 else None


@dataclass
class _Episode:
    lake: LakeMap
    at: Cell
    turn: int = 0
    fell: bool = False
    reached: bool = False
    invalid: int = 0


def _play(episode: _Episode, action: str, allowed: frozenset[str]) -> str | None:
    """Apply one raw action in place; returns the move, or None if it was invalid."""
    episode.turn += 1
    move = parse_move(action)
    if move is None or move not in allowed:
        episode.invalid += 1
        return None
    episode.at = _move(episode.lake, episode.at, move)
    episode.fell = episode.at in episode.lake.holes
    episode.reached = episode.at == episode.lake.goal
    return move


class FrozenLake:
    """The FrozenLake environment bound to a contract."""

    def __init__(
        self, contract: EnvironmentContract, *, sandbox: SandboxBackend | None = None
    ) -> None:
        self.contract = contract
        self._sandbox = sandbox  # used only to run the verifier
        self._size = int(contract.initial_state.get("size", 4))
        self._holes = int(contract.initial_state.get("holes", 3))
        self._layout = str(contract.initial_state.get("layout", "random"))
        if self._layout not in LAYOUTS:
            raise ValueError(f"frozen_lake layout must be one of {', '.join(LAYOUTS)}, "
                             f"got {self._layout!r}")
        self._allowed = frozenset(contract.allowed_actions)
        self._episode: _Episode | None = None
        self._seed = 0
        self._actions: list[str] = []
        self._done = False
        self._deadline = 0.0

    def reset(self, seed: int, item: Mapping[str, Any] | None = None) -> str:
        """Start an episode on the seed's map; returns the grid."""
        refuse_item("frozen_lake", item)
        lake = generate_map(seed, self._size, self._holes, self._layout)
        self._episode = _Episode(lake=lake, at=lake.start)
        self._seed, self._actions, self._done = seed, [], False
        self._deadline = time.monotonic() + self.contract.limits.wall_time_s
        return render(lake, lake.start)

    def step(self, action: str) -> StepResult:
        """Apply one move; invalid text costs a turn and earns the invalid-action term."""
        episode = self._require_running()
        self._actions.append(action)
        move = _play(episode, action, self._allowed)
        process = self.contract.reward.process
        term = "valid_action" if move else "invalid_action"
        reward = process.get(term, 0.0)
        truncated = None
        if episode.turn >= self.contract.limits.max_turns:
            truncated = "max_turns"
        if time.monotonic() > self._deadline:
            truncated = "wall_time"
        self._done = episode.fell or episode.reached or truncated is not None
        feedback: dict[str, Any] = {
            "valid_action": move is not None,
            "move": move,
            "position": list(episode.at),
            "fell_in_hole": episode.fell,
            "goal_reached": episode.reached,
            "truncated": None if episode.fell or episode.reached else truncated,
            REWARD_TERMS: {term: reward},
        }
        return StepResult(
            render(episode.lake, episode.at, episode.fell), reward, self._done, feedback
        )

    def verifier_request(self) -> VerifierRequest:
        """What the verifier needs: the seed, the contract's terms and the raw actions."""
        self._require_started()
        payload = {
            "seed": self._seed,
            "size": self._size,
            "holes": self._holes,
            "layout": self._layout,
            "allowed_actions": sorted(self._allowed),
            "max_turns": self.contract.limits.max_turns,
            "actions": self._actions,
            "reward": dict(self.contract.reward.outcome),
        }
        return VerifierRequest(VERIFIER, payload)

    def outcome(self) -> Outcome:
        """The verifier replays the recorded actions on the seed's map in its own process."""
        return run_verifier(self.verifier_request(), sandbox=self._sandbox)

    def state_fingerprint(self) -> str:
        """sha256 of the grid, the turn and whether the episode is over."""
        episode = self._require_started()
        grid = render(episode.lake, episode.at, episode.fell)
        return fingerprint({"grid": grid, "turn": episode.turn, "done": self._done})

    def close(self) -> None:
        """Nothing to release: the game lives in memory."""
        self._episode = None

    def _require_started(self) -> _Episode:
        if self._episode is None:
            raise EnvironmentStateError("call reset(seed) first")
        return self._episode

    def _require_running(self) -> _Episode:
        episode = self._require_started()
        if self._done:
            raise EnvironmentStateError("the episode is over; call reset(seed) to start another")
        return episode


def verify(payload: dict[str, Any]) -> Outcome:
    """Replay the raw actions on the regenerated map and score them per the contract."""
    lake = generate_map(int(payload["seed"]), int(payload["size"]), int(payload["holes"]),
                        str(payload.get("layout", "random")))
    episode = _Episode(lake=lake, at=lake.start)
    allowed = frozenset(payload["allowed_actions"])
    for action in payload["actions"][: int(payload["max_turns"])]:
        _play(episode, str(action), allowed)
        if episode.fell or episode.reached:
            break
    terms: dict[str, float] = payload["reward"]
    start_distance = _distance(lake.start, lake.goal)
    left = _distance(episode.at, lake.goal)
    # Each outcome term the contract names, earned or not, so the split always sums to reward.
    earned = {term: 0.0 for term in ("success", "failure", "progress") if term in terms}
    if episode.reached:
        earned["success"], reason = terms["success"], "goal_reached"
    else:
        closed = 0.0 if episode.fell else (start_distance - left) / start_distance
        if "failure" in terms:
            earned["failure"] = terms["failure"]
        if "progress" in terms:
            earned["progress"] = terms["progress"] * max(closed, 0.0)
        reason = "fell_in_hole" if episode.fell else "goal_not_reached"
    reward = sum(earned.values())
    details = {
        "reason": reason,
        "goal_reached": episode.reached,
        "fell_in_hole": episode.fell,
        "turns": episode.turn,
        "invalid_actions": episode.invalid,
        "distance_left": left,
        REWARD_TERMS: earned,
    }
    return Outcome(success=episode.reached, reward=float(reward), details=details)


def _contract_map(seed: int, contract: EnvironmentContract) -> LakeMap:
    size = int(contract.initial_state.get("size", 4))
    holes = int(contract.initial_state.get("holes", 3))
    layout = str(contract.initial_state.get("layout", "random"))
    return generate_map(seed, size, holes, layout)


def describe(
    seed: int, item: Mapping[str, Any] | None, contract: EnvironmentContract
) -> TaskContent:
    """The task is its map: two seeds that draw the same map (43 and 190 on the shipped
    4x4 contract) are the same task, and share one content digest."""
    refuse_item("frozen_lake", item)
    lake = _contract_map(seed, contract)
    return TaskContent(
        {"environment": "frozen_lake", "grid": render(lake, lake.start)},
        {"size": str(lake.size), "holes": str(len(lake.holes))},
    )


def reference_solution(
    seed: int, contract: EnvironmentContract, item: Mapping[str, Any] | None = None
) -> list[str]:
    """The shortest safe path as move tokens (``R``, ``D``, ...)."""
    refuse_item("frozen_lake", item)
    path = shortest_path(_contract_map(seed, contract))
    if path is None:  # generate_map only returns solvable maps
        raise ValueError(f"seed {seed} has no path")
    return [TOKENS[move] for move in path]
