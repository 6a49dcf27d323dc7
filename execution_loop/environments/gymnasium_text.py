"""Gymnasium's toy-text games as text: FrozenLake, Taxi and Blackjack, seeded, verified by replay.

The contract's ``initial_state`` names the game (``game: FrozenLake-v1``, ``Taxi-v4`` or
``Blackjack-v1``) and the keyword arguments ``gymnasium.make`` gets (``map_name``,
``is_slippery``, ``is_rainy``, ``natural``, ...). ``map_size: N`` asks FrozenLake for a
random N x N map drawn from the task's seed (Gymnasium's ``generate_random_map(seed=)``).
Every episode starts with ``env.reset(seed=seed)``, so a game's randomness (the deck, the
taxi's start, a slippery step) is the seed's: the same seed and the same actions always
give the same game.

Each turn the model writes one action by name (``left``/``down``/``right``/``up``;
``south``/``north``/``east``/``west``/``pickup``/``dropoff``; ``stick``/``hit``), any
case, in any words around it. Text that names no action or two is invalid: it costs a
turn, earns the ``invalid_action`` process term and leaves the game as it was.

The verdict is the verifier's, in its own interpreter: it makes the game again, resets
it with the seed and replays the model's raw text (``verify``). It imports Gymnasium,
so it declares that installed distribution (``VERIFIER_DISTRIBUTIONS``).

A game is a ``TextGame``: how to make it, its action names, how to render its state and
how an episode ended. Adapting another Gymnasium environment is one more ``TextGame``
(``docs/write-your-own-environment.md``, section "Gymnasium").

Gymnasium is imported when a game is made, never at module import, so the registry (and
every worker) loads without the ``ecosystem`` extra.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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
from execution_loop.verification import VerifierRequest, run_verifier

if TYPE_CHECKING:
    from execution_loop.sandbox import SandboxBackend
    from triloop.contracts import EnvironmentContract

VERIFIER = "execution_loop.environments.gymnasium_text:verify"
VERIFIER_DISTRIBUTIONS = ("gymnasium",)  # installed distributions the verifier imports


@dataclass(frozen=True)
class Ending:
    """How an episode ended, as a game judges it."""

    success: bool
    reason: str


@dataclass(frozen=True)
class TextGame:
    """A Gymnasium environment adapted to text: the adapter protocol.

    ``make(kwargs, seed)`` builds the Gymnasium env (``seed`` only where the env itself
    depends on it, e.g. a random map); ``actions`` maps each action name to the env's
    discrete action; ``render(env, observation)`` is the text the agent sees;
    ``ending(env, returns, terminated)`` is the verdict once the replay stops.
    """

    id: str
    make: Callable[[Mapping[str, Any], int], Any]
    actions: Mapping[str, int]
    render: Callable[[Any, Any], str]
    ending: Callable[[Any, list[float], bool], Ending]
    kwargs: Mapping[str, tuple[type, ...]] = field(default_factory=dict)  # what it accepts
    aliases: Mapping[str, str] = field(default_factory=dict)  # other words for an action
    # Whether the game draws from its RNG after reset (a deck, a slippery step): then the
    # seed is part of what the task is, beyond what the first observation shows.
    stochastic: Callable[[Mapping[str, Any]], bool] = lambda _kwargs: True


def parse_action(game: TextGame, text: str) -> str | None:
    """The one action the text names (by name or alias), else None."""
    words = re.findall(r"[a-z]+", text.lower())
    named = {game.aliases.get(w, w) for w in words}
    found = {n for n in named if n in game.actions}
    return found.pop() if len(found) == 1 else None


def _gym_make(game_id: str, **kwargs: Any) -> Any:
    import gymnasium  # the ecosystem extra; imported only when a game is played

    return gymnasium.make(game_id, **kwargs)


# -- FrozenLake ---------------------------------------------------------------------------

def _lake_make(kwargs: Mapping[str, Any], seed: int) -> Any:
    args = {k: v for k, v in kwargs.items() if k != "map_size"}
    if "map_size" in kwargs:
        from gymnasium.envs.toy_text.frozen_lake import generate_random_map

        args["desc"] = generate_random_map(size=int(kwargs["map_size"]), seed=seed)
        args.pop("map_name", None)
    return _gym_make("FrozenLake-v1", **args)


def _lake_rows(env: Any) -> list[str]:
    return ["".join(c.decode() for c in row) for row in env.unwrapped.desc]


def _lake_render(env: Any, observation: Any) -> str:
    """The map with the player as P (X in a hole): S start, F ice, H hole, G goal."""
    rows = _lake_rows(env)
    width = len(rows[0])
    row, col = divmod(int(observation), width)
    mark = "X" if rows[row][col] == "H" else "P"
    rows[row] = rows[row][:col] + mark + rows[row][col + 1:]
    return "\n".join(rows)


def _lake_ending(env: Any, _returns: list[float], terminated: bool) -> Ending:
    rows = _lake_rows(env)
    row, col = divmod(int(env.unwrapped.s), len(rows[0]))
    cell = rows[row][col]
    if terminated and cell == "G":
        return Ending(True, "goal_reached")
    return Ending(False, "fell_in_hole" if cell == "H" else "goal_not_reached")


# -- Taxi ---------------------------------------------------------------------------------

_TAXI_STOPS = "RGYB"


def _taxi_render(env: Any, observation: Any) -> str:
    """The walled map with the taxi as T, then where the passenger and the destination are."""
    taxi_row, taxi_col, passenger, destination = env.unwrapped.decode(int(observation))
    rows = [[c.decode() for c in row] for row in env.unwrapped.desc]
    rows[taxi_row + 1][2 * taxi_col + 1] = "T"
    where = "in the taxi" if passenger == 4 else f"at {_TAXI_STOPS[passenger]}"
    lines = ["".join(r) for r in rows]
    lines += [f"passenger: {where}", f"destination: {_TAXI_STOPS[destination]}"]
    return "\n".join(lines)


def _taxi_ending(_env: Any, _returns: list[float], terminated: bool) -> Ending:
    # Taxi terminates only on a dropoff at the destination.
    return Ending(True, "delivered") if terminated else Ending(False, "not_delivered")


# -- Blackjack ----------------------------------------------------------------------------

def _blackjack_render(env: Any, observation: Any) -> str:
    """The player's cards and sum, and the dealer's showing card."""
    player_sum, dealer_card, usable_ace = observation
    cards = " ".join(str(c) for c in env.unwrapped.player)
    ace = "yes" if usable_ace else "no"
    return (f"your cards: {cards} (sum {int(player_sum)}, usable ace: {ace})\n"
            f"dealer shows: {int(dealer_card)}")


def _blackjack_ending(_env: Any, returns: list[float], terminated: bool) -> Ending:
    if not terminated:
        return Ending(False, "hand_not_finished")
    last = returns[-1] if returns else 0.0
    if last > 0:
        return Ending(True, "won")
    return Ending(False, "draw" if last == 0 else "lost")


GAMES: dict[str, TextGame] = {
    "FrozenLake-v1": TextGame(
        "FrozenLake-v1", _lake_make, {"left": 0, "down": 1, "right": 2, "up": 3},
        _lake_render, _lake_ending,
        kwargs={"map_name": (str,), "map_size": (int,), "is_slippery": (bool,)},
        aliases={"l": "left", "d": "down", "r": "right", "u": "up"},
        stochastic=lambda kwargs: bool(kwargs.get("is_slippery", True)),  # Gymnasium's default
    ),
    "Taxi-v4": TextGame(
        "Taxi-v4", lambda kwargs, _seed: _gym_make("Taxi-v4", **kwargs),
        {"south": 0, "north": 1, "east": 2, "west": 3, "pickup": 4, "dropoff": 5},
        _taxi_render, _taxi_ending,
        kwargs={"is_rainy": (bool,), "fickle_passenger": (bool,)},
        aliases={"pick": "pickup", "drop": "dropoff"},
        stochastic=lambda kwargs: bool(kwargs.get("is_rainy") or kwargs.get("fickle_passenger")),
    ),
    "Blackjack-v1": TextGame(
        "Blackjack-v1", lambda kwargs, _seed: _gym_make("Blackjack-v1", **kwargs),
        {"stick": 0, "hit": 1}, _blackjack_render, _blackjack_ending,
        kwargs={"natural": (bool,), "sab": (bool,)}, aliases={"stand": "stick"},
    ),
}


def capabilities(games: Mapping[str, TextGame]) -> TaskCapabilities:
    """What an environment over these games supports (the union of their actions)."""
    state: dict[str, tuple[type, ...]] = {"game": (str,)}
    for game in games.values():
        state.update(game.kwargs)
    return TaskCapabilities(
        actions=frozenset(a for g in games.values() for a in g.actions),
        observations=frozenset({"text"}),
        success_criteria=frozenset({"goal_reached"}),
        outcome_terms=frozenset({"success", "failure"}),
        process_terms=frozenset({"valid_action", "invalid_action"}),
        initial_state=state,
        required_state=frozenset({"game"}),
    )


CAPABILITIES = capabilities(GAMES)


def game_of(initial_state: Mapping[str, Any], games: Mapping[str, TextGame]) -> tuple[
        TextGame, dict[str, Any]]:
    """The game a contract names and the keyword arguments it passes; refuses others."""
    name = str(initial_state.get("game", ""))
    game = games.get(name)
    if game is None:
        raise ValueError(f"gymnasium_text has no game {name!r} (known: {', '.join(games)})")
    kwargs = {k: v for k, v in initial_state.items() if k != "game"}
    foreign = sorted(set(kwargs) - set(game.kwargs))
    if foreign:
        raise ValueError(f"{name} takes no {', '.join(foreign)} "
                         f"(it takes {', '.join(game.kwargs) or 'nothing'})")
    return game, kwargs


@dataclass
class _Replay:
    """One game played from the seed: the Gymnasium env and what happened so far."""

    env: Any
    observation: Any
    turn: int = 0
    invalid: int = 0
    returns: list[float] = field(default_factory=list)  # the env's rewards, per valid step
    terminated: bool = False
    truncated: bool = False


def _start(game: TextGame, kwargs: Mapping[str, Any], seed: int) -> _Replay:
    env = game.make(kwargs, seed)
    observation, _info = env.reset(seed=seed)
    return _Replay(env=env, observation=observation)


def _play(game: TextGame, replay: _Replay, text: str, allowed: frozenset[str]) -> str | None:
    """Apply one raw action in place; returns the action, or None if it was invalid."""
    replay.turn += 1
    action = parse_action(game, text)
    if action is None or action not in allowed:
        replay.invalid += 1
        return None
    observation, reward, terminated, truncated, _info = replay.env.step(game.actions[action])
    replay.observation = observation
    replay.returns.append(float(reward))
    replay.terminated, replay.truncated = bool(terminated), bool(truncated)
    return action


class GymnasiumText:
    """A Gymnasium text game bound to a contract; subclass with other ``GAMES`` to adapt more."""

    GAMES: Mapping[str, TextGame] = GAMES
    VERIFIER: str = VERIFIER

    def __init__(
        self, contract: EnvironmentContract, *, sandbox: SandboxBackend | None = None
    ) -> None:
        self.contract = contract
        self._sandbox = sandbox  # used only to run the verifier
        self._game, self._kwargs = game_of(contract.initial_state, self.GAMES)
        self._allowed = frozenset(contract.allowed_actions)
        foreign = sorted(self._allowed - set(self._game.actions))
        if foreign:
            raise ValueError(f"{self._game.id} has no action {', '.join(foreign)} "
                             f"(its actions: {', '.join(self._game.actions)})")
        self._replay: _Replay | None = None
        self._seed = 0
        self._actions: list[str] = []
        self._done = False
        self._deadline = 0.0

    def reset(self, seed: int, item: Mapping[str, Any] | None = None) -> str:
        """Start the game with ``env.reset(seed=seed)``; returns its state as text."""
        refuse_item(self.contract.task, item)
        self.close()
        self._replay = _start(self._game, self._kwargs, seed)
        self._seed, self._actions, self._done = seed, [], False
        self._deadline = time.monotonic() + self.contract.limits.wall_time_s
        return self._game.render(self._replay.env, self._replay.observation)

    def step(self, action: str) -> StepResult:
        """Apply one action by name; invalid text costs a turn and earns the invalid term."""
        replay = self._require_running()
        self._actions.append(action)
        move = _play(self._game, replay, action, self._allowed)
        process = self.contract.reward.process
        reward = process.get("valid_action" if move else "invalid_action", 0.0)
        truncated = "game_truncated" if replay.truncated else None
        if replay.turn >= self.contract.limits.max_turns:
            truncated = "max_turns"
        if time.monotonic() > self._deadline:
            truncated = "wall_time"
        self._done = replay.terminated or truncated is not None
        feedback: dict[str, Any] = {
            "valid_action": move is not None,
            "action": move,
            "env_reward": replay.returns[-1] if move else None,
            "terminated": replay.terminated,
            "truncated": None if replay.terminated else truncated,
        }
        text = self._game.render(replay.env, replay.observation)
        return StepResult(text, reward, self._done, feedback)

    def verifier_request(self) -> VerifierRequest:
        """What the verifier needs: the game, its arguments, the seed and the raw actions."""
        self._require_started()
        payload = {
            "game": self._game.id,
            "kwargs": dict(self._kwargs),
            "seed": self._seed,
            "allowed_actions": sorted(self._allowed),
            "max_turns": self.contract.limits.max_turns,
            "actions": self._actions,
            "reward": dict(self.contract.reward.outcome),
        }
        return VerifierRequest(self.VERIFIER, payload)

    def outcome(self) -> Outcome:
        """The verifier replays the seed and the recorded actions in its own process."""
        return run_verifier(self.verifier_request(), sandbox=self._sandbox)

    def state_fingerprint(self) -> str:
        """sha256 of the rendered state, the turn and whether the episode is over."""
        replay = self._require_started()
        text = self._game.render(replay.env, replay.observation)
        return fingerprint({"game": self._game.id, "text": text, "turn": replay.turn,
                            "done": self._done})

    def close(self) -> None:
        """Close the Gymnasium env."""
        if self._replay is not None:
            self._replay.env.close()
            self._replay = None

    def _require_started(self) -> _Replay:
        if self._replay is None:
            raise EnvironmentStateError("call reset(seed) first")
        return self._replay

    def _require_running(self) -> _Replay:
        replay = self._require_started()
        if self._done:
            raise EnvironmentStateError("the episode is over; call reset(seed) to start another")
        return replay


def verify_with(payload: dict[str, Any], games: Mapping[str, TextGame]) -> Outcome:
    """Replay the raw actions on the seed's game and score the ending per the contract."""
    game, kwargs = game_of({"game": payload["game"], **payload["kwargs"]}, games)
    replay = _start(game, kwargs, int(payload["seed"]))
    allowed = frozenset(payload["allowed_actions"])
    try:
        for text in payload["actions"][: int(payload["max_turns"])]:
            _play(game, replay, str(text), allowed)
            if replay.terminated or replay.truncated:
                break
        ending = game.ending(replay.env, replay.returns, replay.terminated)
    finally:
        replay.env.close()
    terms: dict[str, float] = payload["reward"]
    reward = terms["success"] if ending.success else terms.get("failure", 0.0)
    details = {
        "reason": ending.reason,
        "goal_reached": ending.success,
        "turns": replay.turn,
        "invalid_actions": replay.invalid,
        "env_return": sum(replay.returns),
    }
    return Outcome(success=ending.success, reward=float(reward), details=details)


def describe_with(seed: int, item: Mapping[str, Any] | None, contract: EnvironmentContract,
                  games: Mapping[str, TextGame]) -> TaskContent:
    """A task is its game, its arguments and its first state as the agent sees it; on a
    stochastic game also the seed, whose RNG decides what the first state does not show.
    Two seeds of a deterministic game with the same start (every seed of the fixed
    4x4 map, not slippery) are one task."""
    refuse_item(contract.task, item)
    game, kwargs = game_of(contract.initial_state, games)
    replay = _start(game, kwargs, seed)
    try:
        text = game.render(replay.env, replay.observation)
    finally:
        replay.env.close()
    content: dict[str, Any] = {"environment": contract.task, "game": game.id,
                               "kwargs": kwargs, "initial": text}
    if game.stochastic(kwargs):
        content["rng_seed"] = seed
    return TaskContent(content, {"game": game.id.split("-")[0].lower()})


def describe(seed: int, item: Mapping[str, Any] | None,
             contract: EnvironmentContract) -> TaskContent:
    """The built-in games' task content (``describe_with``)."""
    return describe_with(seed, item, contract, GAMES)


def verify(payload: dict[str, Any]) -> Outcome:
    """The built-in games' verifier (run in the verifier interpreter)."""
    return verify_with(payload, GAMES)


# -- reference solutions --------------------------------------------------------------------

def _plan(env: Any, gamma: float = 0.95, sweeps: int = 500) -> list[int]:
    """The greedy policy of value iteration on the env's own transition table ``P``.

    On a deterministic game (FrozenLake not slippery, Taxi not rainy) it is a shortest
    path to the goal; on a stochastic one it is the best a policy can do, and the seed
    decides whether it gets there.
    """
    table = env.unwrapped.P
    states = sorted(table)
    value = dict.fromkeys(states, 0.0)

    def q(state: int, action: int) -> float:
        return float(sum(p * (r + (0.0 if done else gamma * value[nxt]))
                         for p, nxt, r, done in table[state][action]))

    for _ in range(sweeps):
        change = 0.0
        for s in states:
            best = max(q(s, a) for a in sorted(table[s]))
            change, value[s] = max(change, abs(best - value[s])), best
        if change < 1e-9:
            break
    def best_action(state: int) -> int:
        # ties go to the lowest action number, so a seed always gets the same plan
        return int(max(sorted(table[state]), key=lambda a: (round(q(state, a), 9), -a)))

    return [best_action(s) for s in states]


def _by_plan(game: TextGame, kwargs: Mapping[str, Any], seed: int, turns: int) -> list[str]:
    names = {number: name for name, number in game.actions.items()}
    replay = _start(game, kwargs, seed)
    try:
        policy = _plan(replay.env)
        actions: list[str] = []
        while len(actions) < turns and not (replay.terminated or replay.truncated):
            actions.append(names[policy[int(replay.observation)]])
            _play(game, replay, actions[-1], frozenset(game.actions))
    finally:
        replay.env.close()
    return actions


def _blackjack_oracle(game: TextGame, kwargs: Mapping[str, Any], seed: int,
                      turns: int) -> list[str]:
    """Hit k times then stick, for the first k that wins this seed's deal (else draws, else
    the shortest). It knows the seed's deck, which no policy does: it shows that the hand
    can be won, not that a strategy wins it."""
    tried: list[tuple[int, list[str]]] = []
    for hits in range(turns):
        actions = ["hit"] * hits + ["stick"]
        outcome = verify_with({"game": game.id, "kwargs": dict(kwargs), "seed": seed,
                               "allowed_actions": list(game.actions), "max_turns": turns,
                               "actions": actions, "reward": {"success": 1.0}}, {game.id: game})
        rank = 0 if outcome.success else 1 if outcome.details["reason"] == "draw" else 2
        tried.append((rank, actions))
        if rank == 0 or outcome.details["reason"] == "lost" and outcome.details["turns"] <= hits:
            break  # a win, or busted before the stick: more hits bust as well
    return min(tried, key=lambda t: t[0])[1]


def reference_with(seed: int, contract: EnvironmentContract, games: Mapping[str, TextGame],
                   item: Mapping[str, Any] | None = None) -> list[str]:
    """Scripted actions for the seed: value iteration's plan, or Blackjack's oracle."""
    refuse_item(contract.task, item)
    game, kwargs = game_of(contract.initial_state, games)
    if game.id == "Blackjack-v1":
        return _blackjack_oracle(game, kwargs, seed, contract.limits.max_turns)
    return _by_plan(game, kwargs, seed, contract.limits.max_turns)


def reference_solution(seed: int, contract: EnvironmentContract,
                       item: Mapping[str, Any] | None = None) -> list[str]:
    """The built-in games' reference solution (admission's k-of-k check, tests)."""
    return reference_with(seed, contract, GAMES, item=item)
