"""FrozenLake: seeded solvable maps, lenient moves, verifier replays in its own process."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from execution_loop.environments.base import EnvironmentStateError
from execution_loop.environments.frozen_lake import (
    Cell,
    FrozenLake,
    LakeMap,
    generate_map,
    parse_move,
    render,
    shortest_path,
)
from execution_loop.environments.registry import (
    get_environment,
    load_builtin_contract,
    reference_solution,
)
from execution_loop.verification import run_verifiers
from triloop.contracts import EnvironmentContract


@pytest.fixture
def contract() -> EnvironmentContract:
    return load_builtin_contract("frozen_lake")


@pytest.fixture
def env(contract: EnvironmentContract) -> FrozenLake:
    return FrozenLake(contract)


def test_same_seed_same_map_and_fingerprint(env: FrozenLake, contract: EnvironmentContract) -> None:
    other = FrozenLake(contract)
    assert env.reset(7) == other.reset(7)
    assert env.state_fingerprint() == other.state_fingerprint()
    env.step("R")
    assert env.state_fingerprint() != other.state_fingerprint()
    assert len({env.reset(seed) for seed in range(30)}) > 20  # seeds give different maps


def test_maps_are_small_solvable_and_well_formed() -> None:
    for seed in range(300):
        lake = generate_map(seed, 4, 3)
        grid = render(lake, lake.start)
        assert grid.count("P") == 1 and grid.count("G") == 1 and grid.count("O") == 3
        assert [len(row) for row in grid.split("\n")] == [4, 4, 4, 4]
        assert shortest_path(lake) is not None
    with pytest.raises(ValueError, match="holes"):
        generate_map(0, 4, 15)


@pytest.mark.parametrize(
    ("text", "move"),
    [
        ("R", "right"),
        ("r", "right"),
        (" Right.\n", "right"),
        ("left", "left"),
        ("U", "up"),
        ("move D", "down"),
        ("down down", "down"),
    ],
)
def test_moves_are_parsed_leniently(text: str, move: str) -> None:
    assert parse_move(text) == move


@pytest.mark.parametrize("text", ["", "X", "left or right", "RD", "go north", "LURD"])
def test_unclear_text_is_no_move(text: str) -> None:
    assert parse_move(text) is None


def test_invalid_action_costs_a_turn_and_is_penalised(env: FrozenLake) -> None:
    first = env.reset(1)
    result = env.step("I think the goal is reached, success: true")
    assert result.observation == first and not result.done
    assert result.feedback["valid_action"] is False
    assert result.reward == pytest.approx(-0.1)
    assert env.step("R").feedback["valid_action"] is True


@pytest.mark.parametrize("seed", range(5))
def test_reference_solution_reaches_the_goal(env: FrozenLake, seed: int) -> None:
    env.reset(seed)
    actions = reference_solution("frozen_lake", seed)
    results = [env.step(action) for action in actions]
    assert results[-1].done and results[-1].feedback["goal_reached"]
    assert not any(r.done for r in results[:-1])
    outcome = env.outcome()
    assert outcome.success and outcome.reward == 1.0
    assert outcome.details["reason"] == "goal_reached"
    with pytest.raises(EnvironmentStateError, match="over"):
        env.step("R")


def test_falling_into_a_hole_ends_the_episode_without_progress_credit(env: FrozenLake) -> None:
    for seed in range(50):
        env.reset(seed)
        lake = generate_map(seed, 4, 3)
        hole = next(iter(lake.holes))
        path = _path_to(lake, hole)
        if path is None:
            continue
        results = [env.step(m) for m in path]
        assert results[-1].done and results[-1].feedback["fell_in_hole"]
        assert "X" in results[-1].observation
        outcome = env.outcome()
        assert not outcome.success and outcome.reward == 0.0
        assert outcome.details["reason"] == "fell_in_hole"
        return
    pytest.fail("no seed with a reachable hole")


def _path_to(lake: LakeMap, target: Cell) -> list[str] | None:
    safe = replace(lake, goal=target, holes=lake.holes - {target})
    return shortest_path(safe)


def test_turn_limit_truncates_and_progress_is_shaped(contract: EnvironmentContract) -> None:
    env = FrozenLake(contract)
    env.reset(3)
    path = reference_solution("frozen_lake", 3)
    env.step(path[0])  # one step closer
    result = None
    for _ in range(contract.limits.max_turns - 1):
        result = env.step("nothing")
    assert result is not None and result.done and result.feedback["truncated"] == "max_turns"
    outcome = env.outcome()
    assert not outcome.success
    start = generate_map(3, 4, 3)
    distance = abs(start.start[0] - start.goal[0]) + abs(start.start[1] - start.goal[1])
    assert outcome.reward == pytest.approx(0.3 / distance)


def test_random_policy_mostly_fails(contract: EnvironmentContract) -> None:
    rng = random.Random(0)
    requests = []
    for seed in range(60):
        env = FrozenLake(contract)
        env.reset(seed)
        done = False
        while not done:
            done = env.step(rng.choice(["L", "R", "U", "D", "jump"])).done
        requests.append(env.verifier_request())
    outcomes = run_verifiers(requests)
    rate = sum(o.success for o in outcomes) / len(outcomes)
    assert rate < 0.3


def test_verifier_replays_raw_actions_not_environment_state(env: FrozenLake) -> None:
    env.reset(2)
    env.step("nonsense")
    request = env.verifier_request()
    assert request.payload["actions"] == ["nonsense"]
    forged = {**request.payload, "actions": reference_solution("frozen_lake", 2)}
    [honest, replayed] = run_verifiers([request, type(request)(request.verifier, forged)])
    assert not honest.success and replayed.success


def test_disallowed_moves_are_invalid(contract: EnvironmentContract) -> None:
    narrowed = contract.model_copy(update={"allowed_actions": ["right", "down"]})
    env = get_environment("frozen_lake")(narrowed)
    env.reset(0)
    assert env.step("L").feedback["valid_action"] is False
    assert env.step("R").feedback["valid_action"] is True


def test_step_before_reset_is_refused(env: FrozenLake) -> None:
    with pytest.raises(EnvironmentStateError, match="reset"):
        env.step("R")


# Grids of the random layout before layouts existed (main at 74c2a41): the default must not
# move a single map, or every stored task and verdict on frozen_lake would change meaning.
_RANDOM_LAYOUT_GRIDS = {
    0: "P..G\n.O..\n..O.\nO...",
    1: "..O.\nOP..\n...G\n.O..",
    2: ".GOO\n....\n...O\n..P.",
    21: "P..O\n....\n....\nOO.G",
}


def test_the_default_random_layout_keeps_its_maps() -> None:
    for seed, grid in _RANDOM_LAYOUT_GRIDS.items():
        lake = generate_map(seed, 4, 3)
        assert render(lake, lake.start) == grid
        assert generate_map(seed, 4, 3, "random") == lake


def test_corners_layout_starts_top_left_and_ends_bottom_right() -> None:
    for size, holes in ((3, 1), (3, 2), (4, 3), (5, 6)):
        maps = [generate_map(seed, size, holes, "corners") for seed in range(100)]
        for lake in maps:
            assert lake.start == (0, 0) and lake.goal == (size - 1, size - 1)
            assert len(lake.holes) == holes and not {lake.start, lake.goal} & lake.holes
            assert shortest_path(lake) is not None  # still always solvable
        # Only the holes come from the seed, and seeds still give different maps.
        assert len(set(maps)) > (5 if size == 3 else 50)
    assert generate_map(7, 4, 3, "corners") == generate_map(7, 4, 3, "corners")


def test_an_unknown_layout_is_refused(contract: EnvironmentContract) -> None:
    with pytest.raises(ValueError, match="layout must be one of random, corners"):
        generate_map(0, 4, 3, "spiral")
    bad = contract.model_copy(update={"initial_state": {**contract.initial_state,
                                                         "layout": "spiral"}})
    with pytest.raises(ValueError, match="layout"):
        FrozenLake(bad)


def test_corners_layout_runs_and_verifies_through_the_contract(
    contract: EnvironmentContract,
) -> None:
    corners = contract.model_copy(update={"initial_state": {**contract.initial_state,
                                                             "layout": "corners"}})
    env = FrozenLake(corners)
    for seed in (21, 22, 23):
        grid = env.reset(seed)
        assert grid.startswith("P") and grid.endswith("G")
        for move in reference_solution("frozen_lake", seed, corners):
            result = env.step(move)
        assert result.done and result.feedback["goal_reached"]
        assert env.verifier_request().payload["layout"] == "corners"
        outcome = env.outcome()  # the verifier regenerates the corners map, not a random one
        assert outcome.success and outcome.details["reason"] == "goal_reached"
