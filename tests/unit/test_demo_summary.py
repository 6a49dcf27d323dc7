"""The demo's summary: held-out success before and after, beside reward."""

from __future__ import annotations

from typing import Any

from scripts.demo import held_out_lines


def _policy(successes: int, episodes: int, reward: float) -> dict[str, Any]:
    return {"episodes": episodes, "successes": successes,
            "success_rate": {"estimate": successes / episodes},
            "reward_mean": {"estimate": reward}}


def test_summary_prints_held_out_success_before_and_after_beside_reward() -> None:
    evidence = {"eval_sets": [{"eval_set": "held-out maps", "production": _policy(1, 32, -0.87),
                               "candidate": _policy(9, 32, -0.21)}]}
    promotion = {"gates": [
        {"gate": "stability", "evidence": {}},
        {"gate": "offline_eval", "evidence": {"eval_sets": []}},  # an earlier verdict
        {"gate": "offline_eval", "evidence": evidence},
    ]}
    assert held_out_lines(promotion) == [
        "held-out success (held-out maps): before 1/32 (3%) → after 9/32 (28%);"
        " reward -0.870 → -0.210"]
    assert held_out_lines({"gates": []}) == []
    first = {"eval_sets": [{"eval_set": "s", "production": None,
                            "candidate": _policy(1, 4, 0.0)}]}
    assert held_out_lines({"gates": [{"gate": "offline_eval", "evidence": first}]}) == []
