"""The web service's pure parts: contract diff, charts, cursors, cookies, run validation."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from itsdangerous import TimestampSigner, URLSafeTimedSerializer

from web.auth import ConsoleSession, CookieSigner, bearer_token, hash_token, same_secret
from web.console.charts import CHARTS, line_chart, run_charts
from web.console.rendering import flatten
from web.contract_diff import diff_contracts
from web.pagination import decode_cursor, encode_cursor
from web.problems import ProblemError
from web.run_submission import RunConfigInvalid, validate_run_config


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


def test_chart_marks_alarms_and_describes_itself() -> None:
    svg = line_chart(CHARTS[0], [(0, 0.1), (1, 0.2), (2, None), (3, 0.4)], alarms=[1, 99])
    assert svg.count('class="alarm"') == 1
    assert 'role="img"' in svg and "last 0.4 at iteration 3" in svg
    assert "alarms at iterations 1" in svg
    empty = line_chart(CHARTS[1], [(0, None), (1, float("nan"))], alarms=[])
    assert "no values yet" in empty and "<path" not in empty


def test_run_charts_one_per_metric() -> None:
    metrics = [{"iteration": i, "reward_mean": i / 10, "alarms": ["echo_trap"] if i == 2 else []}
               for i in range(4)]
    charts = run_charts(metrics)  # type: ignore[arg-type]
    assert len(charts) == len(CHARTS)
    assert all('class="alarm"' not in c for c in charts[1:])  # other metrics have no values
    assert 'class="alarm"' in charts[0]


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
    value = signer.dump_session(ConsoleSession(user="alice", csrf="c1"))
    assert signer.load_session(value) == ConsoleSession(user="alice", csrf="c1")
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
    return past.dumps({"user": "alice", "csrf": "c1"})


def test_session_cookie_expires_by_its_signed_timestamp() -> None:
    signer = CookieSigner("secret-one", session_max_age_s=3600)
    now = int(time.time())
    recent = _session_cookie_signed_at("secret-one", now - 3000)
    stale = _session_cookie_signed_at("secret-one", now - 3700)
    assert signer.load_session(recent) == ConsoleSession(user="alice", csrf="c1")
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
    assert good.task_ids == ["t1"] and good.base == "tiny" and good.config["name"] == "r"
    with pytest.raises(RunConfigInvalid) as caught:
        validate_run_config(config=None, config_yaml="name: r\nmodel: {}\n")
    assert any(p.startswith("model.base") for p in caught.value.problems)
    with pytest.raises(RunConfigInvalid):
        validate_run_config(config=None, config_yaml=None)
