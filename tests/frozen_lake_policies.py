"""Scripted FrozenLake policies that read the map from their prompt, as a model would.

Each policy is a function of the latest grid; ``MapReadingPolicy`` serves it through the
real episode loop (the tiny tokenizer renders each turn), and ``play`` runs the real
environment on some maps. ``Lake`` is FrozenLake with its verifier called in this process
(the same function the verifier interpreter runs): tests that are not about the
interpreter skip one start-up per episode.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from transformers import PreTrainedTokenizerBase

from execution_loop.environments.base import Outcome
from execution_loop.environments.frozen_lake import (
    MOVES,
    TOKENS,
    FrozenLake,
    LakeMap,
    shortest_path,
    verify,
)
from execution_loop.environments.registry import load_builtin_contract
from execution_loop.episode import EpisodeRecord, run_episode
from execution_loop.inference.base import FINISH_LENGTH, FINISH_STOP, Generation, decode_action
from learning_loop.tiny_model import build_tokenizer

_GRID = re.compile(r"(?:[.PGOX]{4}\n){3}[.PGOX]{4}")
Cell = tuple[int, int]


def _read(grid: str) -> tuple[LakeMap, Cell]:
    rows = grid.split("\n")
    cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    at = next(cell for cell, ch in cells.items() if ch in "PX")
    goal = next(cell for cell, ch in cells.items() if ch == "G")
    holes = frozenset(cell for cell, ch in cells.items() if ch == "O")
    return LakeMap(len(rows), at, goal, holes), at


def _towards(lake: LakeMap, at: Cell, move: str) -> Cell:
    dr, dc = MOVES[move]
    row, col = at[0] + dr, at[1] + dc
    return (row, col) if 0 <= row < lake.size and 0 <= col < lake.size else at


def honest(grid: str) -> str:
    """The next move of a shortest safe path."""
    lake, _ = _read(grid)
    path = shortest_path(lake)
    return TOKENS[path[0]] if path else "L"


def honest_other_way(grid: str) -> str:
    """A shortest safe path found with the moves tried in the opposite order."""
    lake, at = _read(grid)
    best = len(shortest_path(lake) or [])
    for move in reversed(list(MOVES)):
        nxt = _towards(lake, at, move)
        if nxt == lake.goal:
            return TOKENS[move]
        rest = shortest_path(LakeMap(lake.size, nxt, lake.goal, lake.holes))
        if nxt != at and nxt not in lake.holes and rest is not None and len(rest) == best - 1:
            return TOKENS[move]
    return honest(grid)


def hole_seeker(grid: str) -> str:
    """Straight for the nearest hole: dies early (what a lowered hole penalty teaches)."""
    lake, at = _read(grid)
    target = min(lake.holes, key=lambda h: abs(h[0] - at[0]) + abs(h[1] - at[1]))
    aim = LakeMap(lake.size, at, target, frozenset({lake.goal}))  # around the goal
    path = shortest_path(aim)
    return TOKENS[path[0]] if path else "L"


def wanderer(grid: str) -> str:
    """Never falls in and never arrives: bumps the edge or steps on safe ice."""
    lake, at = _read(grid)
    for move in MOVES:
        if _towards(lake, at, move) == at:
            return TOKENS[move]
    for move in MOVES:
        nxt = _towards(lake, at, move)
        if nxt not in lake.holes and nxt != lake.goal:
            return TOKENS[move]
    return "L"


def invalid_writer(grid: str) -> str:
    """Text the environment cannot parse as a move."""
    del grid
    return "X"


def collapsed(grid: str) -> str:
    """The same answer whatever the map."""
    del grid
    return "D"


class Lake(FrozenLake):
    """FrozenLake with its verifier called in this process (the same function the verifier
    interpreter runs): a fresh interpreter per episode is what this test is not about."""

    def outcome(self) -> Outcome:
        return verify(self.verifier_request().payload)


class MapReadingPolicy:
    """Reads the latest grid from its prompt and answers ``choose(grid)``."""

    checkpoint_id = "scripted"

    def __init__(self, tokenizer: PreTrainedTokenizerBase, choose: Callable[[str], str]):
        self._tokenizer, self._choose = tokenizer, choose

    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    def generate(self, prompt_token_ids: list[int], *, max_new_tokens: int, temperature: float,
                 seed: int | None, stop_token_ids: Sequence[int] = ()) -> Generation:
        del temperature, seed, stop_token_ids
        prompt = self._tokenizer.decode(prompt_token_ids, skip_special_tokens=True)
        text = self._choose(_GRID.findall(prompt)[-1])
        ids = [*self._tokenizer(text, add_special_tokens=False).input_ids,
               self._tokenizer.eos_token_id][:max_new_tokens]
        finish = FINISH_STOP if ids[-1] == self._tokenizer.eos_token_id else FINISH_LENGTH
        return Generation(ids, [-0.1] * len(ids), decode_action(self._tokenizer, ids), finish)



def play(choose: Callable[[str], str], seeds: Iterable[int],
         tokenizer: PreTrainedTokenizerBase | None = None) -> list[EpisodeRecord]:
    """One episode of ``choose`` on each seed's map of the shipped frozen_lake contract."""
    contract = load_builtin_contract("frozen_lake")
    policy = MapReadingPolicy(tokenizer or build_tokenizer(), choose)
    return [run_episode(Lake(contract), policy, seed=seed, task_seed=seed,
                        limits=contract.limits, context_rule=contract.context, temperature=0.0)
            for seed in seeds]
