"""Rebuilding the main loop's trajectory by prefix matching on token ids."""

from __future__ import annotations

import pytest

from execution_loop.gateway.rebuild import MainCall, rebuild_trajectory
from triloop.token_sequence import common_prefix_length


def call(prompt: list[int], completion: list[int]) -> MainCall:
    return MainCall(prompt, completion, [-0.5] * len(completion))


def test_appended_conversation_is_one_segment_with_observations_masked_out() -> None:
    calls = [
        call([1, 2, 3], [10, 11]),
        call([1, 2, 3, 10, 11, 4, 5], [12]),  # observation 4 5 between the calls
        call([1, 2, 3, 10, 11, 4, 5, 12, 6], [13, 14]),
    ]
    rebuilt = rebuild_trajectory(calls)
    assert rebuilt.breaks == []
    [segment] = rebuilt.segments
    assert segment.token_ids == [1, 2, 3, 10, 11, 4, 5, 12, 6, 13, 14]
    assert segment.action_mask == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    assert segment.logprobs == [0.0] * 3 + [-0.5] * 2 + [0.0] * 2 + [-0.5] + [0.0] + [-0.5] * 2
    assert segment.calls == [0, 1, 2] and segment.observation_tokens == [0, 2, 1]
    # Exactly the sampled ids are under the mask, in order.
    sampled = [t for t, m in zip(segment.token_ids, segment.action_mask, strict=True) if m]
    assert sampled == [10, 11, 12, 13, 14] and rebuilt.sampled_tokens == 5


def test_a_compressed_prompt_starts_a_new_segment_and_records_the_break() -> None:
    calls = [
        call([1, 2, 3], [10]),
        call([1, 2, 3, 10, 4], [11]),
        call([1, 2, 7, 8], [12]),  # the agent replaced its history with a summary
        call([1, 2, 7, 8, 12, 5], [13]),
    ]
    rebuilt = rebuild_trajectory(calls)
    assert [s.calls for s in rebuilt.segments] == [[0, 1], [2, 3]]
    [cut] = rebuilt.breaks
    assert (cut.call, cut.common_prefix_tokens, cut.segment_tokens) == (2, 2, 6)
    assert "compressed or rewrote" in cut.reason
    second = rebuilt.segments[1]
    assert second.token_ids == [1, 2, 7, 8, 12, 5, 13]
    assert second.action_mask == [0, 0, 0, 0, 1, 0, 1]
    assert rebuilt.sampled_tokens == 4


def test_a_retokenized_answer_is_a_break_not_a_patch() -> None:
    # The agent sent the answer back edited: ids 10 11 became 10 99. Nothing is patched.
    rebuilt = rebuild_trajectory([call([1, 2], [10, 11]), call([1, 2, 10, 99, 3], [12])])
    assert [b.common_prefix_tokens for b in rebuilt.breaks] == [3]
    assert rebuilt.segments[1].token_ids == [1, 2, 10, 99, 3, 12]


def test_a_shorter_prompt_says_turns_were_dropped() -> None:
    rebuilt = rebuild_trajectory([call([1, 2, 3], [10]), call([1, 2], [11])])
    assert "dropped turns" in rebuilt.breaks[0].reason


def test_logprobs_must_match_the_sampled_ids() -> None:
    with pytest.raises(ValueError, match="1 logprobs for 2 sampled tokens"):
        rebuild_trajectory([MainCall([1], [2, 3], [-0.1])])


def test_no_calls_no_segments() -> None:
    rebuilt = rebuild_trajectory([])
    assert rebuilt.segments == [] and rebuilt.breaks == [] and rebuilt.sampled_tokens == 0
    assert common_prefix_length([1, 2, 3], [1, 2, 4]) == 2
