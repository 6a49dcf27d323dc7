"""Stored trajectories -> the learner's step records: returns, mask checks, what is left out."""

from __future__ import annotations

import pytest

from learning_loop.batch import InvalidSampleError, build_training_samples
from learning_loop.trajectory_reader import (
    StoredStep,
    StoredTrajectory,
    stored_steps,
    to_rollout_data,
)
from triloop.run_config import AdvantageConfig


def step(index: int, reward: float, prompt: int = 3, action: int = 2) -> StoredStep:
    return StoredStep(index, list(range(1, prompt + 1)), [7] * action,
                      [0] * prompt + [1] * action, [-0.5] * action, reward)


def trajectory(tid: str, group: str, total: float, steps: list[StoredStep]) -> StoredTrajectory:
    return StoredTrajectory(tid, group, "task-a", 1, total, steps)


def test_returns_equal_total_reward_including_the_outcome() -> None:
    data = to_rollout_data([
        trajectory("a", "g", 0.9, [step(0, -0.1), step(1, 0.02)]),  # outcome +0.98
        trajectory("b", "g", -0.2, [step(0, -0.1), step(1, -0.1)]),  # no outcome reward
    ])
    samples, result = build_training_samples(data.steps, AdvantageConfig())

    assert [r.total_reward for r in data.returns] == [0.9, -0.2]
    assert len(samples) == 4  # one per model turn; the outcome record trains nothing
    assert result.advantages["a"] == pytest.approx(1.0, abs=1e-5)
    assert result.advantages["b"] == pytest.approx(-1.0, abs=1e-5)
    assert data.lengths == [4, 4] and data.policy_versions == [1, 1]


def test_a_mask_that_marks_prompt_tokens_is_refused() -> None:
    bad = StoredStep(0, [1, 2, 3], [7, 8], [0, 1, 1, 1, 1], [-0.1, -0.2], 0.0)
    with pytest.raises(InvalidSampleError, match="action mask"):
        to_rollout_data([trajectory("a", "g", 0.0, [bad])])


def test_an_empty_mask_means_not_recorded() -> None:
    unrecorded = StoredStep(0, [1, 2, 3], [7, 8], [], [-0.1, -0.2], 0.5)
    data = to_rollout_data([trajectory("a", "g", 0.5, [unrecorded])])
    assert [s.reward for s in data.steps] == [0.5, 0.0]


def _offset_rows(tid: str, offsets: list[tuple[int, int, int, int]]) -> list[dict[str, object]]:
    return [{"trajectory_id": tid, "index": i, "prompt_start": p, "observation_start": o,
             "action_start": a, "action_end": e, "reward": 0.5 * i}
            for i, (p, o, a, e) in enumerate(offsets)]


def test_stored_steps_are_sliced_out_of_the_sequence() -> None:
    sequence = {"trajectory_id": "a", "token_ids": [1, 2, 3, 4, 5, 6, 7],
                "action_mask": [0, 0, 1, 0, 1, 1, 0], "behaviour_logprobs": [-0.1, -0.2, -0.3],
                "segment_starts": [0]}
    steps = stored_steps(_offset_rows("a", [(0, 0, 2, 3), (0, 3, 4, 6)]), [sequence])["a"]
    assert [(s.prompt_token_ids, s.action_token_ids, s.behaviour_logprobs) for s in steps] == [
        ([1, 2], [3], [-0.1]), ([1, 2, 3, 4], [5, 6], [-0.2, -0.3])]
    assert steps[1].action_mask == [0, 0, 0, 0, 1, 1] and steps[1].reward == 0.5


def test_a_sequence_whose_mask_marks_context_is_refused() -> None:
    sequence = {"trajectory_id": "a", "token_ids": [1, 2, 3], "action_mask": [0, 1, 1],
                "behaviour_logprobs": [-0.1, -0.2], "segment_starts": [0]}
    with pytest.raises(InvalidSampleError, match="trajectory 'a': the action mask"):
        stored_steps(_offset_rows("a", [(0, 0, 2, 3)]), [sequence])


def test_steps_without_their_sequence_are_refused() -> None:
    with pytest.raises(InvalidSampleError, match="has steps but no token sequence"):
        stored_steps(_offset_rows("a", [(0, 0, 2, 3)]), [])
