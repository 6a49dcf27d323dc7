"""Rebuild the main loop's trajectory from its model calls by prefix matching on token ids.

Each main-loop call k was fed prompt ``P_k`` and sampled ``A_k``. While the agent only
appends to its conversation, ``P_{k+1}`` starts with ``P_k + A_k`` (the gateway splices
sampled ids back in, so nothing is re-tokenized), and what follows is observation:
template text, tool output, the environment's reply. The rebuilt trajectory is then one
token sequence, ``P_1 A_1 O_2 A_2 O_3 A_3 ...``, with the action mask 1 on exactly the
``A`` tokens and 0 on the prompt and every ``O``.

When a prompt does not extend the sequence (the agent compressed or rewrote its
context, or edited a message), the sequence so far is closed as a segment and a
``TrajectoryBreak`` records where, why and how many leading tokens still agreed; the
next segment starts from that prompt. Token ids are never patched to make a match: a
break is recorded instead, so what the learner trains on is exactly what was sampled.

The session records its calls this way as they are made (``SessionTrajectory``): each
main-loop call's new tokens (the observation its prompt added, then its sampled ids) are
spliced onto the one sequence, and the call keeps only its offsets, so a session of T
calls holds its tokens once (O(T)), not one full prompt per call (O(T^2)). The segmenting
rule is the trajectory store's own (``triloop.token_sequence.SequencePacker``): the
episode's steps are stored as exactly these segments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from triloop.token_sequence import (
    SequencePacker,
    TokenSequence,
    TokenSpan,
    TurnOffsets,
    TurnTokens,
)


@dataclass(frozen=True)
class MainCall:
    """One main-loop model call: the prompt it was fed, what it sampled, their logprobs."""

    prompt_token_ids: Sequence[int]
    completion_token_ids: Sequence[int]
    logprobs: Sequence[float]  # one per completion token


@dataclass(frozen=True)
class TrajectoryBreak:
    """Where the main loop's prompt stopped extending the trajectory."""

    call: int  # index among the main-loop calls
    reason: str
    common_prefix_tokens: int  # leading tokens the new prompt still shares with the segment
    segment_tokens: int  # length of the segment it failed to extend


@dataclass
class Segment:
    """A stretch of the trajectory where every prompt extended the one before."""

    token_ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)  # 1 on sampled tokens only
    logprobs: list[float] = field(default_factory=list)  # behaviour logprob; 0.0 off the mask
    calls: list[int] = field(default_factory=list)
    observation_tokens: list[int] = field(default_factory=list)  # per call: O tokens before it


@dataclass(frozen=True)
class RebuiltTrajectory:
    """The main loop's segments and every break between them."""

    segments: list[Segment]
    breaks: list[TrajectoryBreak]

    @property
    def sampled_tokens(self) -> int:
        """Tokens under the action mask, over all segments."""
        return sum(sum(s.action_mask) for s in self.segments)


def _break_reason(shared: int, prompt: int, segment: int) -> str:
    if prompt < segment and shared == prompt:
        return (f"the prompt ({prompt} tokens) is a prefix of the trajectory ({segment}): "
                "the agent dropped turns")
    return (f"the prompt shares its first {shared} tokens with the trajectory's {segment}: "
            "the agent compressed or rewrote its context")


@dataclass(frozen=True)
class CallPlacement:
    """Where one main-loop call sits in the session's sequence."""

    call: int  # index among the main-loop calls
    segment: int  # which segment holds it (0 first)
    offsets: TurnOffsets  # its prompt is [prompt_start, action_start), its action after
    observation_tokens: int  # tokens its prompt added after the call before (0: it opened)


class SessionTrajectory:
    """The main loop's calls spliced onto one token sequence as they are made.

    Not thread-safe: the session adds calls under its own lock.
    """

    def __init__(self) -> None:
        self._packer = SequencePacker()
        self.placements: list[CallPlacement] = []
        self.breaks: list[TrajectoryBreak] = []

    def add(self, call: MainCall) -> CallPlacement:
        """Splice one call on: its new tokens only, or a new segment (and a break) when its
        prompt does not extend the open segment. Refuses logprobs that do not fit."""
        index = len(self.placements)
        if len(call.logprobs) != len(call.completion_token_ids):
            raise ValueError(f"call {index}: {len(call.logprobs)} logprobs for "
                             f"{len(call.completion_token_ids)} sampled tokens")
        opened = not self._packer.extends(call.prompt_token_ids)
        if opened and self.placements:
            before = self._packer.segment_length()
            shared = self._packer.shared_prefix(call.prompt_token_ids)
            self.breaks.append(TrajectoryBreak(
                index, _break_reason(shared, len(call.prompt_token_ids), before), shared, before))
        at = self._packer.add(
            TurnTokens(call.prompt_token_ids, call.completion_token_ids, call.logprobs))
        placed = CallPlacement(index, len(self.sequence.segment_starts) - 1, at,
                               0 if opened else at.action_start - at.observation_start)
        self.placements.append(placed)
        return placed

    @property
    def sequence(self) -> TokenSequence:
        """The one sequence (read it, never change it: spans point into it)."""
        return self._packer.sequence

    @property
    def offsets(self) -> list[TurnOffsets]:
        """Each main-loop call's offsets, in order (the store's step offsets)."""
        return self._packer.offsets

    def prompt(self, call: int) -> TokenSpan:
        """Call ``call``'s prompt as fed, read in place from the sequence."""
        at = self.offsets[call]
        return TokenSpan(self.sequence.token_ids, at.prompt_start, at.action_start)

    def action(self, call: int) -> TokenSpan:
        """Call ``call``'s sampled ids, read in place from the sequence."""
        at = self.offsets[call]
        return TokenSpan(self.sequence.token_ids, at.action_start, at.action_end)

    @property
    def segments(self) -> int:
        """How many segments the sequence has."""
        return len(self.sequence.segment_starts)

    @property
    def sampled_tokens(self) -> int:
        """Tokens under the action mask."""
        return len(self.sequence.behaviour_logprobs)

    def rebuilt(self) -> RebuiltTrajectory:
        """The segments as separate lists (copies) and the breaks."""
        sequence = self.sequence
        bounds = [*sequence.segment_starts, len(sequence.token_ids)]
        segments: list[Segment] = []
        logprob_at = 0
        for start, end in zip(bounds, bounds[1:], strict=False):
            mask = sequence.action_mask[start:end]
            logprobs: list[float] = []
            for m in mask:
                logprobs.append(sequence.behaviour_logprobs[logprob_at] if m else 0.0)
                logprob_at += int(m)
            segments.append(Segment(sequence.token_ids[start:end], mask, logprobs))
        for placed in self.placements:
            segments[placed.segment].calls.append(placed.call)
            segments[placed.segment].observation_tokens.append(placed.observation_tokens)
        return RebuiltTrajectory(segments, list(self.breaks))


def rebuild_trajectory(calls: Sequence[MainCall]) -> RebuiltTrajectory:
    """Segments and breaks for the main-loop calls, in the order they were made."""
    trajectory = SessionTrajectory()
    for call in calls:
        trajectory.add(call)
    return trajectory.rebuilt()
