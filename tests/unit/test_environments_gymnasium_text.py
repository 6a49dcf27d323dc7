"""gymnasium_text: Gymnasium's toy-text games rendered as text, actions parsed by name,
the verdict a replay of the seed and the raw actions."""

from __future__ import annotations

from pathlib import Path

import pytest

from execution_loop.environments import gymnasium_text as gt
from execution_loop.environments import registry
from execution_loop.environments.base import EnvironmentStateError
from execution_loop.environments.registry import get_environment, reference_solution
from tests.environment_games import GAMES, game_contract, write_game_contract
from triloop.contracts import ContractError, EnvironmentContract, load_contract


def _play(env: gt.GymnasiumText, seed: int, actions: list[str]) -> str:
    text = env.reset(seed)
    for action in actions:
        result = env.step(action)
        text = result.observation
        if result.done:
            break
    return text


@pytest.fixture
def lake(tmp_path: Path) -> EnvironmentContract:
    return game_contract(tmp_path, "FrozenLake-v1")


def test_frozen_lake_renders_the_seeds_map_with_the_player(lake: EnvironmentContract) -> None:
    env = gt.GymnasiumText(lake)
    first = env.reset(5)
    assert first.splitlines() == ["PHFF", "FFFF", "FHFF", "FHHG"]  # Gymnasium's map, seed 5
    again = gt.GymnasiumText(lake)
    assert again.reset(5) == first and again.state_fingerprint() == env.state_fingerprint()
    assert gt.GymnasiumText(lake).reset(6) != first  # another seed, another map
    after = env.step("I go down.")
    assert after.observation.splitlines()[1] == "PFFF" and after.feedback["action"] == "down"


def test_a_hole_shows_as_x_and_fails(lake: EnvironmentContract) -> None:
    env = gt.GymnasiumText(lake)
    env.reset(5)
    result = env.step("right")  # seed 5's map has a hole right of the start
    assert result.done and result.observation.startswith("SX")
    outcome = gt.verify(env.verifier_request().payload)
    assert not outcome.success and outcome.details["reason"] == "fell_in_hole"
    assert outcome.reward == 0.0


@pytest.mark.parametrize("text,action", [
    ("left", "left"), ("D", "down"), ("Move RIGHT!", "right"), ("up up", "up"),
    ("left or right", None), ("jump", None), ("", None),
])
def test_frozen_lake_actions_by_name(text: str, action: str | None) -> None:
    assert gt.parse_action(gt.GAMES["FrozenLake-v1"], text) == action


@pytest.mark.parametrize("game,text,action", [
    ("Taxi-v4", "go south", "south"), ("Taxi-v4", "pick up", "pickup"),
    ("Taxi-v4", "Dropoff.", "dropoff"), ("Taxi-v4", "left", None),
    ("Blackjack-v1", "hit me", "hit"), ("Blackjack-v1", "I stand", "stick"),
    ("Blackjack-v1", "hit then stick", None),
])
def test_taxi_and_blackjack_actions_by_name(game: str, text: str, action: str | None) -> None:
    assert gt.parse_action(gt.GAMES[game], text) == action


def test_an_invalid_action_costs_a_turn_and_the_process_term(lake: EnvironmentContract) -> None:
    env = gt.GymnasiumText(lake)
    start = env.reset(5)
    result = env.step("somewhere nice")
    assert result.observation == start and not result.done
    assert result.reward == lake.reward.process["invalid_action"]
    assert not result.feedback["valid_action"]
    assert env.step("down").reward == lake.reward.process["valid_action"]
    outcome = gt.verify(env.verifier_request().payload)
    assert outcome.details["invalid_actions"] == 1 and outcome.details["turns"] == 2


@pytest.mark.parametrize("game", sorted(GAMES))
def test_each_games_reference_is_verified_by_replay(game: str, tmp_path: Path) -> None:
    contract = game_contract(tmp_path, game)
    env = get_environment("gymnasium_text")(contract)
    seed = 2  # a Blackjack deal that can be won (seed 0's cannot)
    actions = reference_solution("gymnasium_text", seed, contract)
    _play(env, seed, actions)  # type: ignore[arg-type]
    outcome = gt.verify(env.verifier_request().payload)  # type: ignore[attr-defined]
    assert outcome.success and outcome.reward == 1.0, outcome.details
    # the same actions replayed on another seed are another game
    other = gt.verify({**env.verifier_request().payload, "seed": 3,  # type: ignore[attr-defined]
                       "actions": actions[:-1]})
    assert not other.success


def test_taxi_renders_the_map_passenger_and_destination(tmp_path: Path) -> None:
    env = gt.GymnasiumText(game_contract(tmp_path, "Taxi-v4"))
    lines = env.reset(0).splitlines()
    assert lines[0] == "+---------+" and lines[4] == "|T| : | : |"
    assert lines[-2:] == ["passenger: at B", "destination: Y"]
    env.step("pickup")  # not at the passenger: Gymnasium's illegal pickup, a valid action
    result = env.step("dropoff")
    assert not result.done
    assert gt.verify(env.verifier_request().payload).details["reason"] == "not_delivered"


def test_blackjack_renders_the_hand_and_judges_win_loss(tmp_path: Path) -> None:
    env = gt.GymnasiumText(game_contract(tmp_path, "Blackjack-v1"))
    assert env.reset(1) == "your cards: 10 10 (sum 20, usable ace: no)\ndealer shows: 7"
    env.step("stick")
    won = gt.verify(env.verifier_request().payload)
    assert won.success and won.details["reason"] == "won"
    env.reset(0)
    env.step("stick")
    lost = gt.verify(env.verifier_request().payload)
    assert not lost.success and lost.details["reason"] == "lost"
    env.reset(0)
    env.step("hit")
    unfinished = gt.verify(env.verifier_request().payload)
    assert unfinished.details["reason"] in ("hand_not_finished", "lost")


def test_the_blackjack_reference_says_when_a_deal_cannot_be_won(tmp_path: Path) -> None:
    contract = game_contract(tmp_path, "Blackjack-v1")
    actions = reference_solution("gymnasium_text", 0, contract)
    env = gt.GymnasiumText(contract)
    _play(env, 0, actions)
    assert not gt.verify(env.verifier_request().payload).success  # admission refuses seed 0


def test_slippery_lake_is_the_seeds_randomness(tmp_path: Path) -> None:
    state = "  game: FrozenLake-v1\n  map_name: 4x4\n  is_slippery: true\n"
    contract = game_contract(tmp_path, "FrozenLake-v1", state=state)
    moves = ["down", "right", "down", "right", "down", "right"]
    one, two = gt.GymnasiumText(contract), gt.GymnasiumText(contract)
    assert _play(one, 9, moves) == _play(two, 9, moves)
    assert one.state_fingerprint() == two.state_fingerprint()


def test_refusals(tmp_path: Path, lake: EnvironmentContract) -> None:
    with pytest.raises(ValueError, match="no game 'Pong-v5'"):
        gt.GymnasiumText(lake.model_copy(update={"initial_state": {"game": "Pong-v5"}}))
    with pytest.raises(ValueError, match="Taxi-v4 takes no map_size"):
        gt.GymnasiumText(lake.model_copy(update={"initial_state": {"game": "Taxi-v4",
                                                                   "map_size": 4}}))
    with pytest.raises(ValueError, match="FrozenLake-v1 has no action pickup"):
        gt.GymnasiumText(lake.model_copy(update={"allowed_actions": ["left", "pickup"]}))
    path = write_game_contract(tmp_path, "FrozenLake-v1")
    path.write_text(path.read_text().replace("[left, down, right, up]", "[left, fly]"))
    with pytest.raises(ContractError, match="fly"):
        load_contract(path, capabilities=registry.capabilities())
    env = gt.GymnasiumText(lake)
    with pytest.raises(EnvironmentStateError):
        env.step("left")
    with pytest.raises(ValueError, match="takes no item"):
        env.reset(1, item={"map": "SFFG"})
    env.reset(5)
    env.step("right")
    with pytest.raises(EnvironmentStateError, match="over"):
        env.step("left")


def test_the_content_of_a_deterministic_game_is_its_start(tmp_path: Path) -> None:
    fixed = "  game: FrozenLake-v1\n  map_name: 4x4\n  is_slippery: false\n"
    contract = game_contract(tmp_path, "FrozenLake-v1", state=fixed)
    one, two = (registry.describe_task(contract, seed, None) for seed in (1, 2))
    assert one.digest == two.digest  # one map, one start: one task whatever the seed
    assert one.tags == {"game": "frozenlake"}
    drawn = game_contract(tmp_path, "FrozenLake-v1")  # a map drawn from each seed
    assert registry.describe_task(drawn, 1, None).digest != \
        registry.describe_task(drawn, 2, None).digest
    deck = game_contract(tmp_path, "Blackjack-v1")
    # seed 1 and 4 may deal alike; the deck behind the deal is the seed's, so not one task
    assert "rng_seed" in registry.describe_task(deck, 1, None).content


def test_the_verdict_comes_from_the_verifier_process_with_gymnasium(
    lake: EnvironmentContract,
) -> None:
    from execution_loop.admission_probe import RecordingSandbox
    from triloop.environment_code import environment_verifier_hash

    sandbox = RecordingSandbox()
    env = get_environment("gymnasium_text")(lake, sandbox=sandbox)
    _play(env, 5, reference_solution("gymnasium_text", 5, lake))  # type: ignore[arg-type]
    outcome = env.outcome()
    assert outcome.success and outcome.details["reason"] == "goal_reached"
    assert sandbox.verifier_references == [gt.VERIFIER]
    assert environment_verifier_hash("gymnasium_text")  # gymnasium's files count in it
