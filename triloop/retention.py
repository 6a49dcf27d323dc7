"""Checkpoint retention, the words every loop shares: a pruned checkpoint is a clear error.

The learning loop prunes old iterations' weights and trainer state (``learning_loop.
retention``); which ones, the database decides (migration 0026,
``triloop_prune_checkpoints``). Each checkpoint row stays, with its id (the sha256 of the
weights) and its serving hashes, marked ``pruned_at`` / ``pruned_rule``. Whoever then asks
for those weights (execution to serve them, learning to train or resume from them,
governance to roll back to them) gets ``CheckpointPruned`` naming the rule and the way out,
before any file is touched, never a missing-file crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from triloop.models import Checkpoint

# The stack's default for runs whose RUN.yaml leaves ``checkpoints.keep_last`` unset.
DEFAULT_KEEP_LAST = 3


class CheckpointPruned(LookupError):
    """The checkpoint's weights were deleted by a retention rule; its lineage row remains."""

    def __init__(self, checkpoint_id: str, pruned_at: datetime, rule: str, wanted_for: str) -> None:
        super().__init__(
            f"checkpoint {checkpoint_id} was pruned on {pruned_at:%Y-%m-%d %H:%M} UTC by {rule};"
            f" its weights and trainer state are gone (its lineage row and digests remain), so"
            f" it cannot be {wanted_for}. Name a kept checkpoint (production, a proposed"
            f" candidate, or one of the run's recent iterations), or raise the run's"
            f" checkpoints.keep_last for future runs"
        )
        self.checkpoint_id = checkpoint_id
        self.pruned_at = pruned_at
        self.rule = rule


def refuse_pruned(checkpoint: Checkpoint, *, wanted_for: str) -> Checkpoint:
    """The row, if its weights are still kept; ``CheckpointPruned`` otherwise."""
    if checkpoint.pruned_at is not None:
        raise CheckpointPruned(checkpoint.id, checkpoint.pruned_at,
                               checkpoint.pruned_rule or "a retention rule", wanted_for)
    return checkpoint


@dataclass(frozen=True)
class RetentionPolicy:
    """How many iterations a run keeps, as this stack applies it."""

    enabled: bool  # the stack's switch (TRILOOP_CHECKPOINT_RETENTION); off: nothing is pruned
    keep_last: int  # iterations kept when the run's RUN.yaml does not say (count, >= 1)

    def keep_for(self, configured: int | None) -> int | None:
        """Iterations to keep for a run that configured ``configured``; None: keep all."""
        if not self.enabled:
            return None
        return configured if configured is not None else self.keep_last
