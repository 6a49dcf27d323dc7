"""Anchors kept outside the database catch a chain that was rewritten and re-hashed."""

from __future__ import annotations

import pytest

from triloop.audit_anchor import AnchorError, broken_anchors, parse, sign

KEY = "k" * 43


def test_a_kept_anchor_reads_back_and_matches_the_chain_it_was_taken_from() -> None:
    line = sign(7, "ab" * 32, KEY).line()
    anchors = parse(["# kept by the on-call operator", "", line], KEY)
    assert [(a.seq, a.hash) for a in anchors] == [(7, "ab" * 32)]
    assert broken_anchors(anchors, {7: "ab" * 32}) == []


def test_a_rewritten_or_truncated_chain_breaks_the_anchor() -> None:
    anchors = parse([sign(7, "ab" * 32, KEY).line(), sign(9, "cd" * 32, KEY).line()], KEY)
    problems = broken_anchors(anchors, {7: "ef" * 32})
    assert "seq 7" in problems[0] and "rewritten" in problems[0]
    assert "seq 9 was anchored but is no longer in the chain" in problems[1]


@pytest.mark.parametrize("line", [
    f"7 {'ab' * 32} " + "0" * 64,  # a signature made up by whoever edits the file
    sign(7, "ab" * 32, "another key").line(),
    "seven ab cd",
])
def test_an_edited_or_foreign_anchor_is_refused(line: str) -> None:
    with pytest.raises(AnchorError, match="line 1"):
        parse([line], KEY)
