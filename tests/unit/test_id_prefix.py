"""One rule for ids typed by people: an id whole or a unique prefix; an ambiguous prefix
names its candidates, the same words wherever it is typed."""

from __future__ import annotations

from triloop.id_prefix import MAX_CANDIDATES, match_prefix, unmatched_message


def test_an_id_or_a_unique_prefix_names_one_id() -> None:
    ids = ["ab12", "ab123", "cd34"]
    assert match_prefix("cd", ids).id == "cd34"
    assert match_prefix("ab12", ids).id == "ab12"  # exact, although it starts "ab123" too
    assert match_prefix("ab123", ids).id == "ab123"


def test_an_ambiguous_or_unknown_prefix_says_why_with_the_candidates() -> None:
    ambiguous = match_prefix("ab", ["ab2", "zz", "ab1"])
    assert ambiguous.id is None and ambiguous.ambiguous
    assert ambiguous.candidates == ["ab1", "ab2"]
    assert unmatched_message(ambiguous, "checkpoint") == (
        "'ab' is ambiguous: it starts the ids of more than one checkpoint (ab1, ab2);"
        " give more characters")
    unknown = match_prefix("x", ["ab1"])
    assert not unknown.ambiguous
    assert unmatched_message(unknown, "role grant") == (
        "no role grant has an id starting with 'x'")
    many = match_prefix("t", [f"t{i}" for i in range(MAX_CANDIDATES + 1)])
    assert unmatched_message(many, "task").endswith(" and more); give more characters")
