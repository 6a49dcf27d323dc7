"""Contracts of gymnasium_text for each toy-text game, written from the shipped one."""

from __future__ import annotations

from pathlib import Path

from execution_loop.environments import registry
from triloop.contracts import EnvironmentContract, load_contract

SHIPPED = registry.CONTRACTS_DIR / "gymnasium_text.yaml"
# game -> (initial_state lines, allowed actions, max_turns)
GAMES = {
    "FrozenLake-v1": ("  game: FrozenLake-v1\n  map_size: 4\n  is_slippery: false\n",
                      "[left, down, right, up]", 12),
    "Taxi-v4": ("  game: Taxi-v4\n", "[south, north, east, west, pickup, dropoff]", 24),
    "Blackjack-v1": ("  game: Blackjack-v1\n", "[stick, hit]", 6),
}


def write_game_contract(into: Path, game: str, *, state: str | None = None) -> Path:
    """The shipped contract rewritten for ``game`` (``state`` replaces its initial_state)."""
    lines, actions, turns = GAMES[game]
    text = SHIPPED.read_text()
    start = text.index("initial_state:\n") + len("initial_state:\n")
    end = text.index("observations:")
    text = text[:start] + (state or lines) + text[end:]
    text = text.replace("[left, down, right, up]", actions)
    text = text.replace("max_turns: 12", f"max_turns: {turns}")
    path = into / f"gymnasium_text_{game.split('-')[0].lower()}.yaml"
    path.write_text(text)
    return path


def game_contract(into: Path, game: str, *, state: str | None = None) -> EnvironmentContract:
    """The contract for ``game``, loaded and checked against the environment."""
    path = write_game_contract(into, game, state=state)
    return load_contract(path, capabilities=registry.capabilities())
