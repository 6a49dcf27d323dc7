"""Offline eval's placebo control: the candidate must beat a placebo on held-out success.

The Reward Placebo Trial: a placebo run trains the candidate run's own config (model,
tasks, optimizer, seed) with the task term removed from every return
(``advantage.zero_task_reward``), so whatever it learns comes from shaping, process
rewards and the training itself. When the threshold requires it (``PlaceboSpec``), the
placebo run's last checkpoint plays the same eval sets as the candidate, and on every set
the candidate's success rate minus the placebo's must reach ``margin``. The comparison is
on observed rates, as the rest of offline eval's (eval sets are frozen).

Refusals, in this order: no placebo run (the reason names the command that makes one);
on a set, fewer placebo episodes than ``min_samples``; on a set, a gap below the margin.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from governance_loop.gates.stats import EpisodeStats
from governance_loop.gates.thresholds import ThresholdSpec
from triloop.placebo import PLACEBO_COMMAND

# Rates are ratios of counts; a gap that equals the margin must not fail by a rounding.
_TOLERANCE = 1e-9


@dataclass(frozen=True)
class PlaceboArm:
    """The placebo's side of offline eval: which run and checkpoint, and its episodes on
    each eval set (by the set's label). ``run_id`` None: no placebo run was found."""

    candidate_run_id: str  # the run whose placebo this is (named in the way out)
    alias: str  # the alias the promotion moves, for which the placebo is required
    run_id: str | None = None
    checkpoint_id: str | None = None
    eval_sets: Mapping[str, EpisodeStats] = field(default_factory=dict)


@dataclass(frozen=True)
class PlaceboCheck:
    """What the placebo control found: the reasons it fails the gate, and its evidence."""

    reasons: list[str]
    evidence: dict[str, Any]


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def _points(value: float) -> str:
    return f"{value * 100:.1f} points"


def check_placebo(candidate: Mapping[str, EpisodeStats], arm: PlaceboArm,
                  thresholds: ThresholdSpec) -> PlaceboCheck:
    """Judge the candidate's eval sets (label -> its episodes) against the placebo's."""
    spec, version = thresholds.placebo, thresholds.version
    command = f"`{PLACEBO_COMMAND} {arm.candidate_run_id}`"
    evidence: dict[str, Any] = {
        "required_for": arm.alias, "margin": spec.margin, "run_id": arm.run_id,
        "checkpoint_id": arm.checkpoint_id, "command": command, "eval_sets": [],
    }
    if arm.run_id is None or arm.checkpoint_id is None:
        reason = (f"placebo: the {arm.alias} alias requires beating a placebo (thresholds "
                  f"{version}), and no completed placebo run of run {arm.candidate_run_id}'s "
                  f"config has a checkpoint: make one with {command}, let it complete, then "
                  "propose the candidate again")
        evidence["violations"] = [reason]
        return PlaceboCheck([reason], evidence)
    reasons: list[str] = []
    of = f"placebo run {arm.run_id}, checkpoint {arm.checkpoint_id}"
    for name, mine in candidate.items():
        theirs = arm.eval_sets.get(name, EpisodeStats(0, 0, 0.0, 0.0))
        gap = mine.successes / max(1, mine.episodes) - theirs.successes / max(1, theirs.episodes)
        enough = theirs.episodes >= thresholds.min_samples
        met = enough and gap >= spec.margin - _TOLERANCE
        evidence["eval_sets"].append({
            "eval_set": name, "candidate_success_rate": mine.successes / max(1, mine.episodes),
            "placebo_success_rate": theirs.successes / max(1, theirs.episodes),
            "gap": gap, "met": met,
            "placebo": {"episodes": theirs.episodes, "successes": theirs.successes}})
        if not enough:
            reasons.append(f"placebo: eval set {name!r}: the placebo has {theirs.episodes} "
                           f"episodes, min_samples is {thresholds.min_samples} ({of}; "
                           f"thresholds {version})")
        elif not met:
            reasons.append(
                f"placebo: eval set {name!r}: candidate success rate "
                f"{_pct(mine.successes / max(1, mine.episodes))} against the placebo's "
                f"{_pct(theirs.successes / max(1, theirs.episodes))}: a gap of {_points(gap)}, "
                f"the margin is {_points(spec.margin)}, so the gain is not shown to need the "
                "task reward "
                f"({of}; thresholds {version})")
    evidence["violations"] = reasons
    return PlaceboCheck(reasons, evidence)
