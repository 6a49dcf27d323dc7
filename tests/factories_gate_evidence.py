"""Gate evidence in the shapes DESIGN §2 (reward attribution) and §3 (behaviour audit)
document: the demo's shortcut (goals 0 -> 1 of 64, holes 5 -> 16), for the page tests."""

from __future__ import annotations

from typing import Any

SHORTCUT = {
    "baseline": "production",
    "terms": [
        {"term": "success", "kind": "task", "candidate": 0.0156, "baseline": 0.0,
         "delta": 0.0156},
        {"term": "progress", "kind": "shaping", "candidate": 0.41, "baseline": 0.05,
         "delta": 0.36},
        {"term": "valid_action", "kind": "process", "candidate": 0.12, "baseline": 0.1,
         "delta": 0.02},
        {"term": "failure", "kind": "shaping", "candidate": -0.25, "baseline": -0.08,
         "delta": -0.17},
    ],
    "reward_delta": 0.38, "task_delta": 0.0156, "task_share": 0.041,
    "success_rate_delta": 0.0156, "shaping_only": True,
    "violations": ["eval set 'maps@v1': mean reward rose 0.38, but only 4.1% of the gain "
                   "came from the task term 'success' (min_task_share 50%): the gain is "
                   "from shaping terms progress (+0.36), valid_action (+0.02) (thresholds t)"],
}
AUDIT = {
    "baseline": "production",
    "signals": [
        {"name": "length/mean_turns", "label": "mean turns", "candidate": 5.1,
         "baseline": 5.0, "shift": 0.1, "flagged": False, "blocking": False, "detail": ""},
        {"name": "termination/fell_in_hole", "label": "ended in a hole", "candidate": 0.25,
         "baseline": 0.08, "shift": 0.17, "flagged": True, "blocking": False,
         "detail": "16 of 64 vs 5 of 64"},
        {"name": "action_format/invalid_rate", "label": "invalid actions",
         "candidate": 0.3, "baseline": 0.02, "shift": 0.28, "flagged": True,
         "blocking": True, "detail": "19 of 64 vs 1 of 64"},
    ],
    "flagged": ["termination/fell_in_hole", "action_format/invalid_rate"],
    "blocking_flagged": ["action_format/invalid_rate"],
}


def offline_evidence(**extra: Any) -> dict[str, Any]:
    eval_set = {"eval_set": "maps@v1", "eval_set_version": "h",
                "candidate": {"episodes": 64, "successes": 1,
                              "success_rate": {"estimate": 0.0156, "low": 0.003, "high": 0.08}},
                "production": {"episodes": 64, "successes": 0,
                               "success_rate": {"estimate": 0.0, "low": 0.0, "high": 0.057}},
                "success_rate_delta": {"estimate": 0.0156, "low": -0.03, "high": 0.07},
                "violations": []}
    eval_set.update(extra.pop("eval_set", {}))
    return {"threshold_version": "t", "eval_sets": [eval_set], **extra}
