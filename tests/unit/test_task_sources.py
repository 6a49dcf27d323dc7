"""Task sources and split rules: read one way by the web service, execution and governance."""

from __future__ import annotations

import hashlib

import pytest

from triloop.task_sources import (
    TaskSourceError,
    assign_splits,
    dataset_format,
    dataset_rows,
    duplicated_digests,
    parse_seeds,
    parse_tags,
    split_rule_problems,
    take_split_field,
)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_seeds_and_ranges_in_order_each_once() -> None:
    assert parse_seeds("1,2,5-7") == [1, 2, 5, 6, 7]
    with pytest.raises(TaskSourceError) as refused:
        parse_seeds("1,3-1,x,2-3,3")
    assert refused.value.problems == ["'3-1': the range runs backwards",
                                      "'x': a seed is a number, a range is A-B",
                                      "seed 3 is listed more than once"]


def test_jsonl_rows_name_each_malformed_line() -> None:
    assert dataset_rows(b'{"q": 1}\n\n{"q": 2}\n', "jsonl") == [{"q": 1}, {"q": 2}]
    with pytest.raises(TaskSourceError) as refused:
        dataset_rows(b'{"q": 1}\n[1]\n{oops\n', "jsonl")
    assert [p.split(":")[0] for p in refused.value.problems] == ["line 2", "line 3"]
    with pytest.raises(TaskSourceError, match="a .jsonl or a .parquet"):
        dataset_format("rows.csv")
    with pytest.raises(TaskSourceError, match="empty"):
        dataset_rows(b"\n", "jsonl")


def test_a_split_column_leaves_the_item() -> None:
    items, splits = take_split_field([{"q": 1, "split": "eval"}, {"q": 2, "split": "train"}],
                                     "split")
    assert items == [{"q": 1}, {"q": 2}] and splits == ["eval", "train"]
    with pytest.raises(TaskSourceError, match="row 0: split is 'test'"):
        take_split_field([{"q": 1, "split": "test"}], "split")


def test_split_rules_are_checked_before_anything_is_described() -> None:
    assert split_rule_problems({"by": "fraction", "train": 0.8, "eval": 0.2},
                               source_kind="seeds") == []
    assert split_rule_problems({"by": "fraction", "train": 0.8}, source_kind="seeds") == [
        "fraction rule: the shares add up to 0.8, not 1"]
    assert split_rule_problems({"by": "list", "eval": [1], "traffic": [1]},
                               source_kind="seeds") == [
        "list rule: ordinal 1 is in both eval and traffic"]
    assert split_rule_problems({"by": "field", "field": "split"}, source_kind="seeds") == [
        "field rule: only a dataset has columns to split by"]
    assert split_rule_problems({"by": "random"}, source_kind="dataset") == [
        "split rule: by must be fraction, list or field, got 'random'"]


def test_fraction_splits_follow_the_digest_not_the_position() -> None:
    digests = [_digest(str(i)) for i in range(2000)]
    rule = {"by": "fraction", "train": 0.8, "eval": 0.1, "traffic": 0.1}
    splits = assign_splits(rule, digests, [None] * len(digests))
    assert {s: splits.count(s) for s in set(splits)}.keys() == {"train", "eval", "traffic"}
    assert 1500 < splits.count("train") < 1700  # 80% of 2000, give or take
    reversed_splits = assign_splits(rule, digests[::-1], [None] * len(digests))
    assert reversed_splits == splits[::-1]


def test_list_splits_and_duplicates_name_their_ordinals() -> None:
    digests = [_digest("a"), _digest("b"), _digest("a")]
    splits = assign_splits({"by": "list", "eval": [2]}, digests, [None] * 3)
    assert splits == ["train", "train", "eval"]
    assert duplicated_digests(digests, splits) == [
        f"tasks 0, 2 have one content digest {_digest('a')} (splits train, eval): an item "
        "may appear once"]
    with pytest.raises(TaskSourceError, match="ordinal 5 is beyond the last task"):
        assign_splits({"by": "list", "traffic": [5]}, digests, [None] * 3)


def test_tags_are_key_value_pairs() -> None:
    assert parse_tags(["domain=math", "difficulty = 3"]) == {"domain": "math", "difficulty": "3"}
    with pytest.raises(TaskSourceError, match="a tag is key=value"):
        parse_tags(["math"])
