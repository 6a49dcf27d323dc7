"""The web service's pure parts: contract diff, charts, cursors, cookies, run validation."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from itsdangerous import TimestampSigner, URLSafeTimedSerializer

from triloop.contract_diff import diff_contracts
from triloop.run_config import RunConfigError
from web.auth import ConsoleSession, CookieSigner, bearer_token, hash_token, same_secret
from web.console.charts import run_chart_data
from web.console.rendering import flatten
from web.pagination import decode_cursor, encode_cursor
from web.problems import ProblemError
from web.run_submission import validate_run_config


def test_contract_diff_aligns_lists_and_compares_types() -> None:
    a = {"actions": ["read", "swap", "done"], "reward": {"success": 1.0}, "gone": 1}
    b = {"actions": ["read", "done"], "reward": {"success": 1}, "new": [1]}
    changes = [(c.path, c.kind, c.old, c.new) for c in diff_contracts(a, b)]
    assert changes == [
        ("actions[1]", "removed", "swap", None),
        ("gone", "removed", 1, None),
        ("new", "added", None, [1]),
        ("reward.success", "changed", 1.0, 1),
    ]
    assert diff_contracts(a, a) == []
    assert [c.kind for c in diff_contracts({"x": True}, {"x": 1})] == ["changed"]


def test_charts_cover_every_metric_key_and_overlay_reward_prefixes() -> None:
    points = [{"iteration": i, "reward_mean": i / 10, "kl": None,
               "alarms": ["echo_trap"] if i == 2 else [],
               "extra_metrics": {"reward/task/sort": 0.1 * i, "reward/task/count": 0.2,
                                 "reward/env/grid": 0.3, "tool_calls": float(i)}}
              for i in range(4)]
    points[3]["reward_mean"] = float("nan")
    data = run_chart_data(points)
    titles = [c.title for c in data.charts]
    assert titles == ["Reward per task", "Reward per environment", "Reward (mean)",
                      "tool_calls"]
    by_title = {c.title: c for c in data.charts}
    assert [s.label for s in by_title["Reward per task"].series] == ["count", "sort"]
    assert "kl" not in data.columns  # a key with no value gets no chart
    assert data.columns["reward_mean"] == [0.0, 0.1, 0.2, None]
    assert data.alarms == [2] and data.last_iteration == 3
    summary = by_title["Reward (mean)"].summary
    assert "3 iterations, last 0.2 at iteration 2" in summary
    assert "alarms at iterations 2" in summary
    assert "sort: 4 iterations" in by_title["Reward per task"].summary


def test_success_rate_is_charted_beside_reward_and_overlaid_per_task_and_environment() -> None:
    points = [{"iteration": i, "reward_mean": 0.1 * i, "entropy": 1.0, "alarms": [],
               "extra_metrics": {"success/rate": 0.25 * i, "success/task/a": 0.5,
                                 "success/task/b": 0.0, "success/env/grid": 0.25}}
              for i in range(3)]
    data = run_chart_data(points)
    titles = [c.title for c in data.charts]
    assert titles == ["Success rate per task", "Success rate per environment",
                      "Reward (mean)", "Success rate", "Entropy"]
    by_title = {c.title: c for c in data.charts}
    assert data.columns["success/rate"] == [0.0, 0.25, 0.5]
    assert by_title["Success rate"].unit == "share of episodes"
    assert by_title["Success rate per task"].unit == "share of episodes"
    assert [s.label for s in by_title["Success rate per task"].series] == ["a", "b"]


def test_train_logs_print_success_beside_reward() -> None:
    from web.cli_runs import _metrics_line

    line = _metrics_line({"iteration": 3, "reward_mean": -0.5, "entropy": 1.25, "alarms": [],
                          "extra_metrics": {"success/rate": 0.125}})
    assert line == "iteration 3: reward_mean=-0.5, success=0.125, entropy=1.25"
    # A run from before success was recorded reads as it did.
    assert _metrics_line({"iteration": 1, "reward_mean": 0.5, "alarms": []}) == \
        "iteration 1: reward_mean=0.5"


def test_a_run_without_metrics_still_has_a_chart_saying_so() -> None:
    data = run_chart_data([])
    assert [c.summary for c in data.charts] == ["Reward (mean): no values yet"]
    assert data.to_json()["last_iteration"] == -1


def test_cursor_round_trip_and_tamper() -> None:
    now = datetime(2026, 11, 30, 2, 0, tzinfo=UTC)
    assert decode_cursor(encode_cursor((now, "abc")), (datetime, str)) == [now, "abc"]
    assert decode_cursor(encode_cursor((7,)), (int,)) == [7]
    for bad in ("!!", encode_cursor(("x",)), encode_cursor((True,)), encode_cursor((1, 2))):
        with pytest.raises(ProblemError) as caught:
            decode_cursor(bad, (int,))
        assert caught.value.status == 422


def test_session_cookie_is_signed_and_expires_on_a_new_secret() -> None:
    signer = CookieSigner("secret-one", session_max_age_s=3600)
    value = signer.dump_session(ConsoleSession(user="alice", csrf="c1", secret="s1"))
    assert signer.load_session(value) == ConsoleSession(user="alice", csrf="c1", secret="s1")
    # A cookie without the session's secret (from before sessions had one) is nobody's.
    assert signer.load_session(signer.dump_session(ConsoleSession("alice", "c1"))) is None
    assert CookieSigner("secret-two", session_max_age_s=3600).load_session(value) is None
    assert signer.load_session(value[:-2] + "xx") is None
    assert signer.load_flash(signer.dump_flash("success", "done")) == ("success", "done")
    assert signer.load_login_csrf(signer.dump_session(ConsoleSession("a", "b"))) is None


class _SignedAt(TimestampSigner):
    """Signs as if it were ``at`` (seconds since the epoch): a cookie issued in the past."""

    at = 0

    def get_timestamp(self) -> int:
        return self.at


def _session_cookie_signed_at(secret: str, at: int) -> str:
    _SignedAt.at = at
    past = URLSafeTimedSerializer(secret, salt="triloop.session", signer=_SignedAt)
    return past.dumps({"user": "alice", "csrf": "c1", "secret": "s1"})


def test_session_cookie_expires_by_its_signed_timestamp() -> None:
    signer = CookieSigner("secret-one", session_max_age_s=3600)
    now = int(time.time())
    recent = _session_cookie_signed_at("secret-one", now - 3000)
    stale = _session_cookie_signed_at("secret-one", now - 3700)
    assert signer.load_session(recent) == ConsoleSession(user="alice", csrf="c1", secret="s1")
    assert signer.load_session(stale) is None  # expired, whatever the browser kept
    longer = CookieSigner("secret-one", session_max_age_s=7200)
    assert longer.load_session(stale) is not None  # the max age is the setting's


def test_tokens_and_secrets() -> None:
    assert bearer_token("Bearer  tl_x ") == "tl_x"
    assert bearer_token("bearer tl_x") == "tl_x"
    assert bearer_token("Basic abc") is None and bearer_token("Bearer ") is None
    assert len(hash_token("tl_x")) == 64 and hash_token("tl_x") != "tl_x"
    assert same_secret("a", "a") and not same_secret("a", "b") and not same_secret(None, None)


def test_evidence_flattening_and_sample_sizes() -> None:
    rows = dict(flatten({"eval_sets": [{"candidate": {"episodes": 120, "rate": 0.8123456}}],
                         "note": None}))
    assert rows == {"eval_sets[0].candidate.episodes": "120",
                    "eval_sets[0].candidate.rate": "0.8123", "note": "—"}


def test_run_config_validation_lists_problems() -> None:
    good = validate_run_config(config={"name": "r", "model": {"base": "tiny"},
                                       "rollout": {"task_ids": ["t1"]}}, config_yaml=None)
    assert good.rollout.task_ids == ["t1"] and good.model.base == "tiny" and good.name == "r"
    with pytest.raises(RunConfigError) as caught:
        validate_run_config(config=None, config_yaml="name: r\nmodel: {}\n")
    assert any(p.path.startswith("model.base") for p in caught.value.problems)
    with pytest.raises(RunConfigError):
        validate_run_config(config=None, config_yaml=None)
