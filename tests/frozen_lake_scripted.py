"""Scripted frozen_lake policies standing for checkpoints, on the demo's held-out maps.

- ``base``: an untrained model; half its replies unreadable, the rest bumping into the edge;
- ``shortcut``: what a lowered hole penalty teaches: head for the goal greedily, falling into
  the holes on the way, and never take the last step: progress and format reward rise,
  goals do not;
- ``honest``: the base's behaviour, but the reference solution on every other sample: it
  reaches more goals.
Each is ``(map seed, sample) -> the replies of one episode`` on the shipped contract.
"""

from __future__ import annotations

from collections.abc import Callable

from execution_loop.environments.frozen_lake import (
    MOVES,
    TOKENS,
    LakeMap,
    generate_map,
    reference_solution,
)
from execution_loop.environments.registry import get_environment

CONTRACT = get_environment("frozen_lake")().contract
Policy = Callable[[int, int], list[str]]


def lake(seed: int) -> LakeMap:
    """The shipped contract's map for a seed."""
    return generate_map(seed, int(CONTRACT.initial_state["size"]),
                        int(CONTRACT.initial_state["holes"]))


def _distance(a: tuple[int, int], b: tuple[int, int]) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def _bump(grid: LakeMap, at: tuple[int, int]) -> str:
    """A move into the lake's edge from ``at`` (valid, goes nowhere), or unreadable text."""
    edge = {"U": at[0] == 0, "L": at[1] == 0, "D": at[0] == grid.size - 1,
            "R": at[1] == grid.size - 1}
    return next((move for move, blocked in edge.items() if blocked), "??")


def base(seed: int, sample: int) -> list[str]:
    del sample
    grid = lake(seed)
    return ["??" if turn % 2 == 0 else _bump(grid, grid.start)
            for turn in range(CONTRACT.limits.max_turns)]


def shortcut(seed: int, sample: int) -> list[str]:
    del sample
    grid = lake(seed)
    at, replies = grid.start, []
    for _ in range(CONTRACT.limits.max_turns):
        if at in grid.holes:
            break
        if _distance(at, grid.goal) <= 1:  # progress is paid; the goal would end the game
            replies.append(_bump(grid, at))
            continue
        move = min(MOVES, key=lambda m: _distance((at[0] + MOVES[m][0], at[1] + MOVES[m][1]),
                                                  grid.goal))
        at = (at[0] + MOVES[move][0], at[1] + MOVES[move][1])
        replies.append(TOKENS[move])
    return replies


def honest(seed: int, sample: int) -> list[str]:
    return reference_solution(seed, CONTRACT) if sample % 2 == 0 else base(seed, sample)
