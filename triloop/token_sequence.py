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

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload


class ActionMask(Sequence[int]):
    """One turn's mask over its prompt + action, 0 on the prompt and 1 on the action, held
    as its two lengths: a turn's mask is always this shape, and T turns of ever longer
    prompts would otherwise hold O(T^2) zeros. Compares equal to any sequence of the same
    values.
    """

    __slots__ = ("action_length", "prompt_length")

    def __init__(self, prompt_length: int, action_length: int) -> None:
        if prompt_length < 0 or action_length < 0:
            raise ValueError(f"lengths must be >= 0, got {prompt_length} and {action_length}")
        self.prompt_length, self.action_length = prompt_length, action_length

    def __len__(self) -> int:
        return self.prompt_length + self.action_length

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return [int(i >= self.prompt_length) for i in range(len(self))[index]]
        if not -len(self) <= index < len(self):
            raise IndexError("mask index out of range")
        return int(index % len(self) >= self.prompt_length)

    def __iter__(self) -> Iterator[int]:
        return itertools.chain(itertools.repeat(0, self.prompt_length),
                               itertools.repeat(1, self.action_length))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ActionMask):
            return (self.prompt_length, self.action_length) == (
                other.prompt_length, other.action_length)
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # equal to lists, so unhashable like them

    def __repr__(self) -> str:
        return f"ActionMask(prompt={self.prompt_length}, action={self.action_length})"


def step_action_mask(prompt_length: int, action_length: int) -> ActionMask:
    """One turn's mask over its prompt + action: only the action is trainable."""
    return ActionMask(prompt_length, action_length)


def marks_only_the_action(mask: Sequence[int], prompt_length: int, action_length: int) -> bool:
    """Whether ``mask`` is 0 on exactly the first ``prompt_length`` ids and 1 on the
    ``action_length`` after them (checked without building the expected mask)."""
    if isinstance(mask, ActionMask):
        return mask == ActionMask(prompt_length, action_length)
    return len(mask) == prompt_length + action_length and all(
        int(m) == int(i >= prompt_length) for i, m in enumerate(mask))


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


def common_prefix_length(a: Iterable[int], b: Iterable[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class TokenSpan(Sequence[int]):
    """``ids[start:stop]`` without copying: a turn's prompt read in place from the sequence
    that holds it, so a session of T calls keeps its tokens once, not once per call.

    ``ids`` only ever grows (a sequence is appended to, never edited), so the span keeps
    meaning what it meant. Compares equal to any sequence of the same ids.
    """

    __slots__ = ("_ids", "_start", "_stop")

    def __init__(self, ids: list[int], start: int, stop: int) -> None:
        if not 0 <= start <= stop <= len(ids):
            raise ValueError(f"span [{start}, {stop}) is outside the {len(ids)} ids")
        self._ids, self._start, self._stop = ids, start, stop

    @property
    def base(self) -> list[int]:
        """The list the span reads from."""
        return self._ids

    def __len__(self) -> int:
        return self._stop - self._start

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            picked = range(self._start, self._stop)[index]
            if picked.step == 1:  # the common case, copied at C speed
                return self._ids[picked.start : picked.stop]
            return [self._ids[i] for i in picked]
        if not -len(self) <= index < len(self):
            raise IndexError("span index out of range")
        return self._ids[self._start + index % len(self)]

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(self._ids, self._start, self._stop)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # equal to lists, so unhashable like them

    def __add__(self, other: Sequence[int]) -> list[int]:
        return [*self, *other]

    def __radd__(self, other: Sequence[int]) -> list[int]:
        return [*other, *self]

    def __repr__(self) -> str:
        return f"TokenSpan({self._start}:{self._stop} of {len(self._ids)})"


class SequencePacker:
    """``pack_turns`` one turn at a time: each turn's new tokens are spliced onto the
    sequence as it arrives, and a turn whose prompt does not extend the open segment
    opens a new one (the rule above). The gateway records a session's calls with it, so
    a session holds its tokens once; ``pack_turns`` is this over a finished list.
    """

    def __init__(self) -> None:
        self.sequence = TokenSequence([], [], [], [])
        self.offsets: list[TurnOffsets] = []
        self._segment_start = 0

    def shared_prefix(self, prompt: Sequence[int]) -> int:
        """How many leading ids ``prompt`` shares with the open segment."""
        return common_prefix_length(
            itertools.islice(self.sequence.token_ids, self._segment_start, None), prompt)

    def segment_length(self) -> int:
        """Tokens in the open segment (0 before the first turn)."""
        return len(self.sequence.token_ids) - self._segment_start

    def extends(self, prompt: Sequence[int]) -> bool:
        """Whether ``prompt`` starts with the whole open segment (then only its new tokens
        are added); never before the first turn."""
        current = self.segment_length()
        return bool(self.offsets) and len(prompt) >= current and (
            list(prompt[:current]) == self.sequence.token_ids[self._segment_start :])

    def add(self, turn: TurnTokens) -> TurnOffsets:
        """Splice one turn onto the sequence; its offsets (also appended to ``offsets``)."""
        if len(turn.behaviour_logprobs) != len(turn.action_token_ids):
            raise SequenceLayoutError(
                f"turn {len(self.offsets)}: {len(turn.behaviour_logprobs)} behaviour logprobs"
                f" for {len(turn.action_token_ids)} action tokens; the rollout must store one"
                " per action token")
        sequence, ids = self.sequence, self.sequence.token_ids
        if self.extends(turn.prompt_token_ids):
            current = self.segment_length()
        else:
            self._segment_start, current = len(ids), 0
            sequence.segment_starts.append(self._segment_start)
        observation_start = len(ids)
        ids.extend(int(t) for t in itertools.islice(turn.prompt_token_ids, current, None))
        sequence.action_mask.extend([0] * (len(ids) - observation_start))
        action_start = len(ids)
        ids.extend(int(t) for t in turn.action_token_ids)
        sequence.action_mask.extend([1] * (len(ids) - action_start))
        sequence.behaviour_logprobs.extend(float(x) for x in turn.behaviour_logprobs)
        at = TurnOffsets(self._segment_start, observation_start, action_start, len(ids))
        self.offsets.append(at)
        return at


def pack_turns(turns: Sequence[TurnTokens]) -> tuple[TokenSequence, list[TurnOffsets]]:
    """The sequence of these turns (in order) and each turn's offsets into it."""
    packer = SequencePacker()
    for turn in turns:
        packer.add(turn)
    return packer.sequence, packer.offsets


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
