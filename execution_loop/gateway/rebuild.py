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

The segmenting rule is the trajectory store's own (``triloop.token_sequence.pack_turns``):
the episode's steps are stored as exactly these segments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from triloop.token_sequence import TurnTokens, pack_turns


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


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _break_reason(shared: int, prompt: int, segment: int) -> str:
    if prompt < segment and shared == prompt:
        return (f"the prompt ({prompt} tokens) is a prefix of the trajectory ({segment}): "
                "the agent dropped turns")
    return (f"the prompt shares its first {shared} tokens with the trajectory's {segment}: "
            "the agent compressed or rewrote its context")


def rebuild_trajectory(calls: Sequence[MainCall]) -> RebuiltTrajectory:
    """Segments and breaks for the main-loop calls, in the order they were made."""
    for index, call in enumerate(calls):
        if len(call.logprobs) != len(call.completion_token_ids):
            raise ValueError(f"call {index}: {len(call.logprobs)} logprobs for "
                             f"{len(call.completion_token_ids)} sampled tokens")
    sequence, offsets = pack_turns([
        TurnTokens(c.prompt_token_ids, c.completion_token_ids, c.logprobs) for c in calls])
    ids, mask = sequence.token_ids, sequence.action_mask
    segments: dict[int, Segment] = {}
    breaks: list[TrajectoryBreak] = []
    logprob_at = 0
    for index, (call, at) in enumerate(zip(calls, offsets, strict=True)):
        opened = at.prompt_start not in segments
        if opened and segments:
            before = segments[max(segments)]  # the segment this prompt failed to extend
            prompt = [int(t) for t in call.prompt_token_ids]
            shared = common_prefix_length(prompt, before.token_ids)
            breaks.append(TrajectoryBreak(
                index, _break_reason(shared, len(prompt), len(before.token_ids)),
                shared, len(before.token_ids)))
        segment = segments.setdefault(at.prompt_start, Segment())
        span = range(at.observation_start, at.action_end)
        segment.token_ids += ids[span.start : span.stop]
        segment.action_mask += mask[span.start : span.stop]
        sampled = at.action_end - at.action_start
        segment.logprobs += [0.0] * (at.action_start - at.observation_start) + list(
            sequence.behaviour_logprobs[logprob_at : logprob_at + sampled])
        logprob_at += sampled
        segment.calls.append(index)
        segment.observation_tokens.append(0 if opened else at.action_start - at.observation_start)
    return RebuiltTrajectory(list(segments.values()), breaks)
