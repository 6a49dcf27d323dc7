"""The demo's summary: held-out goals (and holes) before and after, beside reward; and why
offline eval held a candidate whose gain was shaping only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scripts.demo import (
    chain_line,
    held_for_shaping,
    held_out_lines,
    serving_line,
    sign_in_lines,
)
from scripts.demo_world import Person


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
        "held-out goals (held-out maps): before 1/32 (3%) → after 9/32 (28%);"
        " reward -0.870 → -0.210"]
    assert held_out_lines({"gates": []}) == []
    first = {"eval_sets": [{"eval_set": "s", "production": None,
                            "candidate": _policy(1, 4, 0.0)}]}
    assert held_out_lines({"gates": [{"gate": "offline_eval", "evidence": first}]}) == []


def _shortcut_gate() -> dict[str, Any]:
    reason = ("eval set 'frozen-lake-maps@v1': mean reward rose 0.38, but only 4.1% of the "
              "gain came from the task term 'success' (+0.0156; min_task_share 50%): the gain "
              "is from shaping terms progress (+0.36), valid_action (+0.02) (thresholds p@v1)")
    attribution = {"baseline": "production", "shaping_only": True, "violations": [reason],
                   "terms": [
                       {"term": "success", "kind": "task", "delta": 0.0156},
                       {"term": "failure", "kind": "shaping", "delta": 0.0},
                       {"term": "progress", "kind": "shaping", "delta": 0.36},
                       {"term": "valid_action", "kind": "process", "delta": 0.02}]}
    return {"gate": "offline_eval", "passed": False, "reasons": [reason], "evidence": {
        "eval_sets": [{"eval_set": "frozen-lake-maps@v1", "attribution": attribution,
                       "production": _policy(0, 64, -0.87), "candidate": _policy(1, 64, -0.49)}],
        "behaviour_audit": {"signals": [{"name": "termination/fell_in_hole",
                                         "candidate": 0.25, "baseline": 5 / 64}]}}}


def test_summary_counts_holes_when_the_behaviour_audit_did() -> None:
    assert held_out_lines({"gates": [_shortcut_gate()]}) == [
        "held-out goals (frozen-lake-maps@v1): before 0/64 (0%), holes 5 → after 1/64 (2%),"
        " holes 16; reward -0.870 → -0.490"]


def test_a_candidate_held_for_shaping_only_is_explained_by_its_terms() -> None:
    gate = _shortcut_gate()
    lines = held_for_shaping({"status": "rejected", "gates": [gate]})
    assert lines[0] == ("frozen-lake-maps@v1: per-term change in mean reward: success (task) "
                        "+0.016, progress (shaping) +0.360, valid_action (process) +0.020")
    assert lines[1] == gate["reasons"][0]
    passed = {**gate, "passed": True}
    assert held_for_shaping({"gates": [passed]}) == []
    other = {**gate, "evidence": {"eval_sets": [{"eval_set": "s", "attribution": None}]}}
    assert held_for_shaping({"gates": [other]}) == []  # held for another reason


def test_the_summary_prints_sentences_never_none_or_a_dict() -> None:
    assert chain_line({"ok": True, "checked": 1126, "broken_seq": None, "problem": None}) == (
        "verified, 1126 events, no gap and no edit")
    broken = chain_line({"ok": False, "checked": 40, "broken_seq": 41, "problem": "hash"})
    assert broken == "BROKEN at seq 41: hash (40 events verified before it)"
    alone = serving_line({"checkpoint_id": "a" * 64, "rollback_target_id": None})
    assert "None" not in alone and "(no rollback target: no earlier revision" in alone
    assert serving_line({"checkpoint_id": "a" * 64, "rollback_target_id": "b" * 64}).endswith(
        f"(rollback target {'b' * 16}…)")


def test_the_demo_says_how_to_sign_in_as_each_of_its_people(tmp_path: Path) -> None:
    people = {"operator": Person("olga-1", ["operator"], "secret-token"),
              "ml_engineer": Person("maya-1", ["ml_engineer"], "other-token")}
    lines = sign_in_lines("http://127.0.0.1:8000", tmp_path, people)
    assert lines[0] == ("sign in to the console at http://127.0.0.1:8000/login with a"
                        " person's API token:")
    assert f"$(cat {tmp_path / 'demo-operator-token'})" in lines[1] and "olga-1" in lines[1]
    assert f"$(cat {tmp_path / 'demo-ml-engineer-token'})" in lines[2]
    assert not any("secret-token" in line for line in lines)  # the file, never the token
