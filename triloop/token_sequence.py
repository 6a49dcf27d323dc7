"""One token sequence per trajectory: pack a trajectory's turns, and slice them back out.

Turn k was fed prompt ``P_k`` and sampled action ``A_k``. While each prompt extends the
one before (``P_{k+1}`` starts with ``P_k + A_k``: the harness appends the model's own
ids, the template and the environment's reply and never re-tokenizes), the trajectory is
one sequence ``P_1 A_1 O_2 A_2 O_3 A_3 ...`` where ``O_{k+1}`` is what ``P_{k+1}`` adds
after ``A_k``. It is stored once, so storage grows linearly with the turns, and the
learner scores every action with one forward pass.

The rule when a prompt does NOT extend the sequence (a context rule that keeps only the
last K turns, an agent that compresses or rewrites its history): the sequence so far is
closed and a new *segment* starts, holding that whole prompt. Nothing is patched to make
a match, so every turn's prompt and action are reproduced exactly; tokens attend only
within their segment (the learner runs one forward per segment). The execution loop's
gateway applies the same rule when it rebuilds a black-box agent's calls
(``execution_loop.gateway.rebuild``).

Pure functions over plain data; both loops use them (the execution loop to write, the
learning loop to read and to pack its forward passes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def step_action_mask(prompt_length: int, action_length: int) -> list[int]:
    """One turn's mask over its prompt + action: only the action is trainable."""
    return [0] * prompt_length + [1] * action_length


class SequenceLayoutError(ValueError):
    """Turns or a stored sequence that do not fit the layout; the message says which."""


@dataclass(frozen=True)
class TurnTokens:
    """One turn's tokens as generated: the prompt fed, the action sampled, its logprobs."""

    prompt_token_ids: Sequence[int]
    action_token_ids: Sequence[int]
    behaviour_logprobs: Sequence[float]  # one per action token


@dataclass(frozen=True)
class TurnOffsets:
    """Where one turn sits in the sequence (token offsets, end exclusive)."""

    prompt_start: int  # its segment's start: the prompt is [prompt_start, action_start)
    observation_start: int  # what this turn added before acting: [observation_start, action_start)
    action_start: int
    action_end: int


@dataclass(frozen=True)
class TokenSequence:
    """A trajectory's tokens, action mask, action logprobs and segment starts."""

    token_ids: list[int]
    action_mask: list[int]  # 1 exactly on the sampled tokens
    behaviour_logprobs: list[float]  # one per action-mask token, in order
    segment_starts: list[int]


def pack_turns(turns: Sequence[TurnTokens]) -> tuple[TokenSequence, list[TurnOffsets]]:
    """The sequence of these turns (in order) and each turn's offsets into it."""
    sequence = TokenSequence([], [], [], [])
    offsets: list[TurnOffsets] = []
    segment_start = 0
    for index, turn in enumerate(turns):
        prompt = [int(t) for t in turn.prompt_token_ids]
        action = [int(t) for t in turn.action_token_ids]
        if len(turn.behaviour_logprobs) != len(action):
            raise SequenceLayoutError(
                f"turn {index}: {len(turn.behaviour_logprobs)} behaviour logprobs for"
                f" {len(action)} action tokens; the rollout must store one per action token")
        ids = sequence.token_ids
        current = len(ids) - segment_start
        extends = bool(offsets) and prompt[:current] == ids[segment_start:]
        if not extends:
            segment_start = len(ids)
            sequence.segment_starts.append(segment_start)
            current = 0
        observation_start = len(ids)
        ids.extend(prompt[current:])
        sequence.action_mask.extend([0] * (len(prompt) - current))
        action_start = len(ids)
        ids.extend(action)
        sequence.action_mask.extend([1] * len(action))
        sequence.behaviour_logprobs.extend(float(x) for x in turn.behaviour_logprobs)
        offsets.append(TurnOffsets(segment_start, observation_start, action_start, len(ids)))
    return sequence, offsets


def unpack_turns(sequence: TokenSequence, offsets: Sequence[TurnOffsets]) -> list[TurnTokens]:
    """Each turn's prompt, action and logprobs, exactly as packed; refuses a bad layout."""
    check_layout(sequence, offsets)
    ids = sequence.token_ids
    turns: list[TurnTokens] = []
    logprob_at = 0
    for turn in offsets:
        length = turn.action_end - turn.action_start
        turns.append(TurnTokens(
            ids[turn.prompt_start : turn.action_start],
            ids[turn.action_start : turn.action_end],
            sequence.behaviour_logprobs[logprob_at : logprob_at + length],
        ))
        logprob_at += length
    return turns


def check_layout(sequence: TokenSequence, offsets: Sequence[TurnOffsets]) -> None:
    """Offsets in order and in bounds, prompts starting at a segment start, and the mask 1
    on exactly the turns' action spans with one logprob each."""
    size = len(sequence.token_ids)
    if len(sequence.action_mask) != size:
        raise SequenceLayoutError(
            f"the action mask has {len(sequence.action_mask)} entries for {size} tokens")
    starts = set(sequence.segment_starts)
    expected = [0] * size
    previous_end = 0
    for index, turn in enumerate(offsets):
        where = f"turn {index}"
        if not (turn.prompt_start <= turn.observation_start <= turn.action_start
                <= turn.action_end <= size):
            raise SequenceLayoutError(f"{where}: offsets {turn} are out of order or past the"
                                      f" {size} tokens of the sequence")
        if turn.prompt_start not in starts:
            raise SequenceLayoutError(f"{where}: its prompt starts at {turn.prompt_start},"
                                      " which is not a segment start")
        if turn.observation_start != max(previous_end, turn.prompt_start):
            raise SequenceLayoutError(f"{where}: its new context starts at"
                                      f" {turn.observation_start}, not where the turn before"
                                      " ended or its segment began")
        expected[turn.action_start : turn.action_end] = [1] * (turn.action_end - turn.action_start)
        previous_end = turn.action_end
    if [int(m) for m in sequence.action_mask] != expected:
        raise SequenceLayoutError(
            "the action mask does not mark exactly the turns' action tokens; the learner trains"
            " on model-generated tokens only and will not guess which ones they are")
    if len(sequence.behaviour_logprobs) != sum(expected):
        raise SequenceLayoutError(
            f"{len(sequence.behaviour_logprobs)} behaviour logprobs for {sum(expected)} action"
            " tokens; the rollout must store one per action token")
