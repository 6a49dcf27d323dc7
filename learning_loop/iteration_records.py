"""How an iteration becomes rows: ``training_step`` columns, alarm records, stored history.

Pure functions over the learning core's dataclasses (plus reading a checkpoint's saved
iteration record back), shared by ``training`` and the ``update`` activity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from learning_loop.stability import Alarm, IterationMetrics
from learning_loop.trajectory_reader import RolloutData
from learning_loop.update import UpdateMetrics


def alarm_record(alarm: Alarm) -> dict[str, Any]:
    """An alarm as plain, JSON-safe data (stored with the checkpoint and audited)."""
    record: dict[str, Any] = finite({"kind": alarm.kind, "iteration": alarm.iteration,
                                     "message": alarm.message, "evidence": dict(alarm.evidence)})
    return record


def step_columns(
    stability: IterationMetrics, update: UpdateMetrics | None, alarms: Sequence[Alarm],
    zero_variance_groups: int, groups: int, data: RolloutData,
    series: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The ``training_step`` columns of an iteration (JSON-safe: no NaN or infinity)."""
    columns: dict[str, Any] = finite({
        "loss": update.loss if update else None,
        "kl": stability.kl,
        "entropy": stability.token_entropy if update else None,
        "reward_mean": stability.reward_mean,
        "reward_variance": stability.reward_variance,
        "within_group_reward_variance": stability.within_group_reward_variance,
        "grad_norm": stability.grad_norm,
        "discrimination": stability.retrieval_accuracy,
        "trainable_tokens": update.trainable_tokens if update else 0,
        "length_stats": {"p50": stability.length_p50, "p90": stability.length_p90,
                         "max": stability.length_max},
        "metrics": {
            "stability": stability.as_dict(),
            "update": update.as_dict() if update else None,
            "batch": {"trajectories": len(data.returns), "skipped": data.skipped,
                      "truncated_excluded": data.truncated_excluded,
                      "groups": groups, "zero_variance_groups": zero_variance_groups,
                      "policy_versions": sorted(set(data.policy_versions))},
            # Each alarm as one object (kind, iteration, message, evidence), as audited.
            "alarms": [alarm_record(a) for a in alarms],
            # Flat name -> number keys (reward/task/<id>, reward/env/<name>, ...): see
            # learning_loop.batch_metrics.
            "series": dict(series or {}),
        },
        # The kinds alone: an index for SQL (the console's alarm list, governance's
        # stability gate); the alarms themselves are metrics.alarms.
        "alarms": [a.kind for a in alarms],
    })
    return columns


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSONB has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def stability_history(rows: Sequence[Mapping[str, Any]]) -> list[IterationMetrics]:
    """Earlier iterations' monitors from their stored ``training_step.metrics``."""
    history = []
    for metrics in rows:
        stored = metrics.get("stability")
        if isinstance(stored, dict):
            history.append(IterationMetrics(**stored))
    return history


def saved_iteration(checkpoint_dir: Path, *, run_id: str, iteration: int) -> dict[str, Any] | None:
    """The iteration record a checkpoint was saved with, if it is this run's ``iteration``."""
    state_file = checkpoint_dir / "trainer_state.pt"
    if not state_file.is_file():
        return None
    state = torch.load(state_file, map_location="cpu", weights_only=True)
    metadata = state.get("metadata") or {}
    cursor = state.get("data_cursor") or {}
    if metadata.get("iteration") != iteration or cursor.get("run_id") != run_id:
        return None
    return dict(metadata)
