"""One forward pass per trajectory: pack a batch's turns into sequences, then pad them.

A training sample is one turn (its full prompt, its action, the turn's advantage). Turns
of one trajectory whose prompts extend each other (``triloop.token_sequence``: turn k+1's
prompt starts with turn k's prompt + action) are packed into one sequence
``P_1 A_1 O_2 A_2 ...``; a causal model's logits at the ``A_k`` positions are the same
function of the same tokens as in turn k's own forward pass, so the loss and gradient
equal the per-turn layout's up to float rounding, at one forward per trajectory instead
of one per turn over ever-growing prefixes. A turn whose prompt does not extend the
sequence starts a new one (its own forward), exactly as the stored layout starts a new
segment.

Each action span keeps its own turn's advantage, so every credit option of
``learning_loop.advantages`` (per-turn or per-trajectory) is unchanged, and
``turn_weights`` (1/|turn| on each action token) lets the "sequence" aggregation keep
averaging per turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from learning_loop.batch import InvalidSampleError, TrainingSample
from triloop.token_sequence import TurnTokens, pack_turns


@dataclass(frozen=True)
class SequenceSample:
    """One segment of a trajectory: its tokens and, per turn, the action span and advantage."""

    trajectory_id: str
    token_ids: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]  # per turn: action tokens [start, end) of token_ids
    behaviour_logprobs: tuple[float, ...]  # one per action token, in span order
    advantages: tuple[float, ...]  # one per turn
    importance_weights: tuple[float, ...]  # one per action token (1 unless corrected)

    @property
    def length(self) -> int:
        """Tokens in the sequence."""
        return len(self.token_ids)


@dataclass(frozen=True)
class SequenceBatch:
    """Right-padded sequences; per-token tensors are aligned with logits[:, :-1]."""

    input_ids: torch.Tensor  # [B, L] int64
    attention_mask: torch.Tensor  # [B, L] int64, 1 on real tokens
    action_mask: torch.Tensor  # [B, L-1] float32, 1 where the target token is an action
    behaviour_logprobs: torch.Tensor  # [B, L-1] float32, 0 off the action mask
    advantages: torch.Tensor  # [B, L-1] float32, the target's turn advantage
    importance_weights: torch.Tensor  # [B, L-1] float32, 1 unless importance-corrected
    turn_weights: torch.Tensor  # [B, L-1] float32, 1/|turn| on action tokens

    def to(self, device: torch.device) -> SequenceBatch:
        """The same batch on ``device``."""
        return SequenceBatch(
            self.input_ids.to(device), self.attention_mask.to(device),
            self.action_mask.to(device), self.behaviour_logprobs.to(device),
            self.advantages.to(device), self.importance_weights.to(device),
            self.turn_weights.to(device),
        )


def pack_samples(samples: Sequence[TrainingSample]) -> list[SequenceSample]:
    """The samples' turns packed per trajectory (first-seen order, turns in given order)."""
    return [sequence for sequence, _ in pack_samples_indexed(samples)]


def pack_samples_indexed(
    samples: Sequence[TrainingSample],
) -> list[tuple[SequenceSample, list[int]]]:
    """``pack_samples`` with, per sequence, the index in ``samples`` of each of its spans."""
    by_trajectory: dict[str, list[int]] = {}
    for position, sample in enumerate(samples):
        by_trajectory.setdefault(sample.trajectory_id, []).append(position)
    packed: list[tuple[SequenceSample, list[int]]] = []
    for trajectory_id, positions in by_trajectory.items():
        turns = [samples[p] for p in positions]
        sequence, offsets = pack_turns([
            TurnTokens(t.prompt_token_ids, t.action_token_ids, t.behaviour_logprobs)
            for t in turns
        ])
        bounds = [*sequence.segment_starts, len(sequence.token_ids)]
        for start, end in zip(bounds, bounds[1:], strict=False):
            members = [k for k, at in enumerate(offsets) if at.prompt_start == start]
            packed.append((SequenceSample(
                trajectory_id=trajectory_id,
                token_ids=tuple(sequence.token_ids[start:end]),
                spans=tuple((offsets[k].action_start - start, offsets[k].action_end - start)
                            for k in members),
                behaviour_logprobs=tuple(lp for k in members
                                         for lp in turns[k].behaviour_logprobs),
                advantages=tuple(turns[k].advantage for k in members),
                importance_weights=tuple(
                    w for k in members for w in (turns[k].importance_weights
                                                 or (1.0,) * len(turns[k].action_token_ids))),
            ), [positions[k] for k in members]))
    return packed


def collate_sequences(
    sequences: Sequence[SequenceSample], *, pad_token_id: int = 0
) -> SequenceBatch:
    """Right-pad sequences into one batch (padding is masked out of attention and loss)."""
    if not sequences:
        raise InvalidSampleError("cannot collate an empty list of sequences")
    rows, width = len(sequences), max(s.length for s in sequences)
    input_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    per_token = {name: torch.zeros((rows, width - 1), dtype=torch.float32)
                 for name in ("mask", "behaviour", "advantage", "turn")}
    weights = torch.ones((rows, width - 1), dtype=torch.float32)
    for row, s in enumerate(sequences):
        input_ids[row, : s.length] = torch.tensor(s.token_ids, dtype=torch.long)
        attention[row, : s.length] = 1
        at = 0  # index into the per-action-token tuples
        for (start, end), advantage in zip(s.spans, s.advantages, strict=True):
            n = end - start
            if n == 0:
                continue
            # Action token at input position p is predicted by the logits at p - 1.
            cols = slice(start - 1, end - 1)
            per_token["mask"][row, cols] = 1.0
            per_token["behaviour"][row, cols] = torch.tensor(
                s.behaviour_logprobs[at : at + n], dtype=torch.float32)
            per_token["advantage"][row, cols] = advantage
            per_token["turn"][row, cols] = 1.0 / n
            weights[row, cols] = torch.tensor(s.importance_weights[at : at + n],
                                              dtype=torch.float32)
            at += n
    return SequenceBatch(input_ids, attention, per_token["mask"], per_token["behaviour"],
                         per_token["advantage"], weights, per_token["turn"])
