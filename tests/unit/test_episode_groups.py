"""Grouped episodes: how a batch is cut into group activities, what one decision covers,
and when a group heartbeats (a fake clock: no wall-clock timing)."""

from __future__ import annotations

import pytest

from execution_loop.contracts import EpisodeSpec
from execution_loop.liveness import EpisodeLiveness
from execution_loop.store import (
    TrajectoryRow,
    authorization_sets,
    trajectory_resource,
    trajectory_set_resource,
)
from execution_loop.workflows import episode_groups


def spec(group: int, sample: int) -> EpisodeSpec:
    return EpisodeSpec(episode_id=f"b:{group}:{sample}", task_id=f"t{group}", task_seed=group,
                       group_id=f"b:{group}", sample_index=sample, checkpoint_id="c",
                       purpose="training")


def row(sample: int, checkpoint: str = "c", purpose: str = "training",
        status: str = "completed") -> TrajectoryRow:
    return TrajectoryRow(id=f"b:0:{sample}", batch_id="b", task_id="t0", checkpoint_id=checkpoint,
                         purpose=purpose, group_id="b:0", status=status, sample_index=sample,
                         run_id="r", num_steps=sample + 1)


def test_groups_stay_together_and_are_cut_at_the_concurrency_limit() -> None:
    specs = [spec(g, s) for g in range(3) for s in range(5)]
    chunks = episode_groups(specs, max_concurrency=4)
    assert [[s.episode_id for s in chunk] for chunk in chunks] == [
        ["b:0:0", "b:0:1", "b:0:2", "b:0:3"], ["b:0:4"],
        ["b:1:0", "b:1:1", "b:1:2", "b:1:3"], ["b:1:4"],
        ["b:2:0", "b:2:1", "b:2:2", "b:2:3"], ["b:2:4"],
    ]
    assert all(len({s.group_id for s in chunk}) == 1 for chunk in chunks)
    assert [len(c) for c in episode_groups(specs, max_concurrency=0)] == [1] * 15


def test_one_decision_lists_every_episode_of_the_set() -> None:
    rows = [row(0), row(1, status="truncated"), row(2)]
    resource = trajectory_set_resource(rows)
    assert (resource.kind, resource.id) == ("trajectory", "b:0")
    assert resource.attrs["trajectory_ids"] == ["b:0:0", "b:0:1", "b:0:2"]
    assert resource.attrs["statuses"] == ["completed", "truncated", "completed"]
    assert resource.attrs["num_steps"] == [1, 2, 3]
    assert (resource.attrs["checkpoint_id"], resource.attrs["purpose"]) == ("c", "training")
    # A set of one is asked about exactly as a lone episode.
    assert trajectory_set_resource([rows[0]]) == trajectory_resource(rows[0])


def test_a_decision_never_covers_episodes_with_different_inputs() -> None:
    mixed = [row(0), row(1, checkpoint="canary", purpose="canary"), row(2)]
    with pytest.raises(ValueError, match="same"):
        trajectory_set_resource(mixed)
    sets = authorization_sets(mixed)
    assert [[r.id for r in s] for s in sets] == [["b:0:0", "b:0:2"], ["b:0:1"]]
    assert all(trajectory_set_resource(s) for s in sets)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_group_heartbeats_with_its_steps_and_is_throttled() -> None:
    clock = Clock()
    beat = EpisodeLiveness(timeout_s=10.0, clock=clock)
    beat.started("a")
    beat.started("b")
    beat.stepped("a", 1)
    assert beat.due() is None  # too soon after the start
    clock.now += 1.0
    beat.stepped("a", 2)
    report = beat.due()
    assert report is not None and report.steps == 2
    beat.stepped("b", 1)
    assert beat.due() is None  # throttled: the last beat was just now
    clock.now += 1.0
    beat.stepped("b", 3)
    report = beat.due()
    assert report is not None and report.steps == 5  # steps of every episode


def test_a_stuck_episode_holds_the_heartbeat_back_until_it_ends() -> None:
    clock = Clock()
    beat = EpisodeLiveness(timeout_s=10.0, clock=clock)
    beat.started("stuck")
    beat.started("busy")
    clock.now += 11.0  # "stuck" has been silent for longer than the heartbeat timeout
    beat.stepped("busy", 1)
    assert beat.due() is None
    beat.finished("stuck")
    clock.now += 1.0
    beat.stepped("busy", 2)
    report = beat.due()
    assert report is not None and report.steps == 2
    assert EpisodeLiveness(timeout_s=None, clock=clock).due() is None  # just started


def test_decoded_tokens_are_signs_of_life_and_a_silent_turn_is_named() -> None:
    """A turn longer than the timeout stays alive token by token; without tokens it is
    held back, and the report names the silent episode's stage."""
    clock = Clock()
    beat = EpisodeLiveness(timeout_s=10.0, clock=clock)
    beat.started("e")
    beat.alive("e", "decoding turn 1 of episode e (1 tokens so far)")
    for tokens in range(2, 8):  # 6 tokens, 3 s apart: 18 s of turn, never 10 s silent
        clock.now += 3.0
        beat.alive("e", f"decoding turn 1 of episode e ({tokens} tokens so far)")
        assert beat.due() is not None
    clock.now += 9.0
    report = beat.due()
    assert report is not None and report.stage == "decoding turn 1 of episode e (7 tokens so far)"
    assert report.silent_s == pytest.approx(9.0)
    clock.now += 1.0  # the engine stalled: 10 s without a token
    assert beat.due() is None


def test_loading_a_checkpoint_is_alive_however_long_it_takes() -> None:
    clock = Clock()
    beat = EpisodeLiveness(timeout_s=10.0, clock=clock)
    beat.started("e")
    with beat.loading("e", "abcdef0123456789"):
        clock.now += 60.0
        report = beat.due()
        assert report is not None and report.stage == "loading checkpoint abcdef012345"
    clock.now += 9.0
    assert beat.due() is not None  # loading ended with a sign of life
