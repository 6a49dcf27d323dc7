"""One token sequence per trajectory: every turn's prompt and action come back exactly.

The harness renders every built-in environment's prompts; each contract's context rule
decides whether a prompt extends the one before (keep all turns) or rewrites it (keep
the last K), and the layout must store both exactly.
"""

from __future__ import annotations

import random

import pytest
from transformers import PreTrainedTokenizerBase

from execution_loop.environments.registry import load_builtin_contract
from execution_loop.harness import ChatHarness, Turn
from execution_loop.store import StepRow, pack_steps
from learning_loop.tiny_model import build_tokenizer
from triloop.token_sequence import (
    SequenceLayoutError,
    TokenSequence,
    TurnOffsets,
    TurnTokens,
    check_layout,
    pack_turns,
    unpack_turns,
)

BUILTIN = ("frozen_lake", "tool_arithmetic", "fix_ci_failure")


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return build_tokenizer()


def play(harness: ChatHarness, tokenizer: PreTrainedTokenizerBase, turns: int, keep: int,
         seed: int = 0) -> list[TurnTokens]:
    """Prompts as the episode loop renders them, with random actions (some cut short)."""
    rng = random.Random(seed)
    played: list[Turn] = []
    out: list[TurnTokens] = []
    for k in range(turns):
        prompt = harness.prompt_token_ids(system="Be brief.", initial_observation="Start here.",
                                          turns=played, keep_last_turns=keep)
        words = " ".join(rng.choice(["L", "R", "call", "x=1", "<tool>"]) for _ in range(3))
        action = list(tokenizer(words, add_special_tokens=False).input_ids)
        if k % 3 != 1:  # the model ended its turn (else: cut at the token cap)
            action.append(tokenizer.eos_token_id)
        out.append(TurnTokens(prompt, action, [-0.5 - k] * len(action)))
        played.append(Turn(action, f"observation {k}: " + "ok " * rng.randint(0, 4)))
    return out


@pytest.mark.parametrize("name", BUILTIN)
def test_every_builtin_environment_round_trips_exactly(
    name: str, tokenizer: PreTrainedTokenizerBase
) -> None:
    contract = load_builtin_contract(name)
    keep = contract.context.keep_last_turns
    harness = ChatHarness(tokenizer, tools=list(contract.tools or []))
    turns = play(harness, tokenizer, turns=9, keep=keep)
    sequence, offsets = pack_turns(turns)
    for got, want in zip(unpack_turns(sequence, offsets), turns, strict=True):
        assert list(got.prompt_token_ids) == list(want.prompt_token_ids)
        assert list(got.action_token_ids) == list(want.action_token_ids)
        assert list(got.behaviour_logprobs) == list(want.behaviour_logprobs)
    # Keeping every turn, each prompt extends the one before: one segment. Keeping the last
    # K, turn K+1 onwards drops a turn, so each of those opens a segment of its own.
    assert len(sequence.segment_starts) == (1 if keep == 0 else 1 + max(0, 9 - 1 - keep))


def test_prefix_extension_stores_the_opening_context_once(
    tokenizer: PreTrainedTokenizerBase
) -> None:
    harness = ChatHarness(tokenizer)
    turns = play(harness, tokenizer, turns=20, keep=0)
    sequence, offsets = pack_turns(turns)
    per_step = sum(len(t.prompt_token_ids) + len(t.action_token_ids) for t in turns)
    assert len(sequence.token_ids) == len(turns[-1].prompt_token_ids) + len(
        turns[-1].action_token_ids)
    assert len(sequence.token_ids) * 5 < per_step  # linear against quadratic
    assert all(at.prompt_start == 0 for at in offsets)
    assert sum(sequence.action_mask) == len(sequence.behaviour_logprobs)


def test_a_prompt_that_rewrites_history_opens_a_segment() -> None:
    turns = [TurnTokens([1, 2], [3], [-0.1]), TurnTokens([1, 2, 3, 4], [5, 6], [-0.2, -0.3]),
             TurnTokens([1, 9, 4], [7], [-0.4])]  # an edited earlier message
    sequence, offsets = pack_turns(turns)
    assert sequence.token_ids == [1, 2, 3, 4, 5, 6, 1, 9, 4, 7]
    assert sequence.action_mask == [0, 0, 1, 0, 1, 1, 0, 0, 0, 1]
    assert sequence.segment_starts == [0, 6]
    assert offsets == [TurnOffsets(0, 0, 2, 3), TurnOffsets(0, 3, 4, 6), TurnOffsets(6, 6, 9, 10)]
    assert unpack_turns(sequence, offsets)[2].prompt_token_ids == [1, 9, 4]


def test_step_rows_pack_in_order() -> None:
    rows = [StepRow(i, [1, 2, *range(10, 10 + 2 * i)], [10 + 2 * i, 11 + 2 * i], [],
                    [-0.1, -0.2], "", "", {}, 0.0, False) for i in range(3)]
    sequence, offsets = pack_steps(rows)
    assert sequence.token_ids == [1, 2, 10, 11, 12, 13, 14, 15]
    assert [at.action_start for at in offsets] == [2, 4, 6]


def test_logprobs_that_do_not_match_the_action_are_refused() -> None:
    with pytest.raises(SequenceLayoutError, match="1 behaviour logprobs for 2 action tokens"):
        pack_turns([TurnTokens([1], [2, 3], [-0.1])])


@pytest.mark.parametrize(("mask", "offsets", "match"), [
    ([0, 1, 1, 0], [TurnOffsets(0, 0, 1, 2)], "does not mark exactly"),
    ([0, 1, 0, 0], [TurnOffsets(0, 0, 1, 9)], "out of order or past"),
    ([0, 1, 0, 0], [TurnOffsets(1, 1, 1, 2)], "not a segment start"),
    ([0, 1, 0, 1], [TurnOffsets(0, 0, 1, 2), TurnOffsets(0, 0, 3, 4)], "new context starts"),
])
def test_a_stored_layout_that_does_not_check_out_is_refused(
    mask: list[int], offsets: list[TurnOffsets], match: str
) -> None:
    sequence = TokenSequence([5, 6, 7, 8], mask, [-0.1] * sum(mask), [0])
    with pytest.raises(SequenceLayoutError, match=match):
        check_layout(sequence, offsets)


def test_a_step_whose_mask_marks_its_prompt_is_refused() -> None:
    row = StepRow(0, [1, 2], [3], [0, 1, 1], [-0.1], "", "", {}, 0.0, False)
    with pytest.raises(SequenceLayoutError, match="step 0: its action mask"):
        pack_steps([row])
