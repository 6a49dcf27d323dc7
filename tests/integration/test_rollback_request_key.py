"""A rollback's history reason is the person's or the watch's own words; the key that makes
a retried activity find its committed move lives in the rollback's audit event instead of
leaking into the reason (`rollback [promotion-…/…/32]: watch: …`)."""

from __future__ import annotations

from typing import Any

import pytest

from governance_loop.activities.rollback import committed_rollback, history_reason
from governance_loop.activity_support import record
from tests.factories import uid
from triloop.db import session_scope

pytestmark = pytest.mark.integration


def test_a_retried_rollback_finds_its_committed_move_by_the_key_in_its_audit_event(
    role_engine: Any,
) -> None:
    engine = role_engine("governance")
    alias, key = uid("alias-").lower(), f"[promotion-{uid()}/{uid()}/32]"
    with session_scope(engine) as session:
        record(session, action="rollback", resource={"kind": "deployment", "id": alias},
               payload={"from": "ckpt-b", "to": "ckpt-a", "target_revision": 3,
                        "reason": "watch: regressed", "request_key": key})
    with session_scope(engine) as session:
        found = committed_rollback(session, alias, key)
        assert found is not None
        assert (found.checkpoint_id, found.previous_checkpoint_id, found.target_revision) == (
            "ckpt-a", "ckpt-b", 3)
        assert committed_rollback(session, alias, key + "x") is None
        assert committed_rollback(session, uid("other-"), key) is None
        assert committed_rollback(session, alias, "") is None


def test_the_history_keeps_the_reason_in_words() -> None:
    assert history_reason("  watch: success fell 0.4 below production ") == (
        "watch: success fell 0.4 below production")
    assert history_reason("") == "rollback"
