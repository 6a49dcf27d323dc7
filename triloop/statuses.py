"""The words each status column may hold, as enums: API filters and CLI options validate
against them, so ``--status bogus`` is refused with the allowed values instead of
matching nothing. The columns themselves stay text (their migrations define them)."""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """Where a training run is."""

    submitted = "submitted"
    running = "running"
    paused = "paused"
    completed = "completed"
    completed_with_alarms = "completed_with_alarms"
    cancelled = "cancelled"
    failed = "failed"


# A run in one of these has ended: `train ... --wait` stops waiting.
FINISHED_RUN_STATUSES = frozenset({RunStatus.completed, RunStatus.completed_with_alarms,
                                   RunStatus.cancelled, RunStatus.failed})


class PromotionStatus(StrEnum):
    """Where a candidate's promotion is."""

    open = "open"
    rejected = "rejected"
    aborted = "aborted"
    promoted = "promoted"
    rolled_back = "rolled_back"
    expired = "expired"


class TaskStatus(StrEnum):
    """A task's admission."""

    pending = "pending"
    admitted = "admitted"
    rejected = "rejected"


class GrantStatus(StrEnum):
    """A request for a privileged role."""

    pending = "pending"
    active = "active"
    refused = "refused"
