"""Where a task set's tasks come from, and how they are split: read the same way everywhere.

The web service checks a registration with these (422 before anything is recorded), the
execution loop reads a dataset's rows with them to describe each task, and governance
reads them again to write the tasks, so a row means one thing to all three.

- A dataset file is JSONL (one JSON object per non-blank line) or Parquet (one row per
  task); each row is a task's item, and its ordinal (0, 1, ...) its seed. A split column
  (``{"by": "field", "field": "split"}``) is taken out of the item: the split is where a
  task goes, not what it is, so one row in two splits is one item, refused at registration.
- Seeds: ``1,2,5-9``.
- Split rules: ``{"by": "fraction", "train": 0.8, "eval": 0.1, "traffic": 0.1}`` (by
  digest, so deterministic and the same for the same content), ``{"by": "list", "eval":
  [ordinals], "traffic": [ordinals]}`` (the rest train), ``{"by": "field", "field": NAME}``.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from triloop.statuses import TaskSplit

DATASET_FORMATS = ("jsonl", "parquet")
MAX_DATASET_BYTES = 64 * 2**20
MAX_TASKS = 100_000
SPLITS = tuple(split.value for split in TaskSplit)
_SEED_PART = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


class TaskSourceError(ValueError):
    """A dataset, seed list or split rule that cannot be used; ``problems`` names each."""

    def __init__(self, summary: str, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        shown = "; ".join(self.problems[:20])
        more = f" (and {len(self.problems) - 20} more)" if len(self.problems) > 20 else ""
        super().__init__(f"{summary}: {shown}{more}")


def dataset_format(filename: str) -> str:
    """``jsonl`` or ``parquet`` from a file's name."""
    lowered = filename.lower()
    if lowered.endswith(".jsonl"):
        return "jsonl"
    if lowered.endswith(".parquet"):
        return "parquet"
    raise TaskSourceError("unknown dataset format", [
        f"{filename}: a dataset is a .jsonl or a .parquet file"])


def dataset_rows(data: bytes, fmt: str) -> list[dict[str, Any]]:
    """Every row of a dataset file as a JSON object, or ``TaskSourceError`` naming each bad
    row (by line for JSONL, by row number for Parquet)."""
    if fmt not in DATASET_FORMATS:
        raise TaskSourceError("unknown dataset format", [
            f"format {fmt!r}: use one of {', '.join(DATASET_FORMATS)}"])
    if len(data) > MAX_DATASET_BYTES:
        raise TaskSourceError("the dataset is too large", [
            f"{len(data)} bytes; at most {MAX_DATASET_BYTES}"])
    rows = _jsonl_rows(data) if fmt == "jsonl" else _parquet_rows(data)
    if not rows:
        raise TaskSourceError("the dataset is empty", ["no rows"])
    if len(rows) > MAX_TASKS:
        raise TaskSourceError("the dataset has too many rows", [
            f"{len(rows)} rows; at most {MAX_TASKS}"])
    return rows


def _jsonl_rows(data: bytes) -> list[dict[str, Any]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TaskSourceError("the dataset is not UTF-8", [str(error)]) from error
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            problems.append(f"line {number}: not JSON ({error})")
            continue
        if not isinstance(row, dict):
            problems.append(f"line {number}: a row must be a JSON object, got "
                            f"{type(row).__name__}")
            continue
        rows.append(row)
    if problems:
        raise TaskSourceError(f"{len(problems)} malformed dataset row(s)", problems)
    return rows


def _parquet_rows(data: bytes) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq  # only here: the kernel runs without the ecosystem extra

    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as error:  # pyarrow's own error types: a file it cannot read
        raise TaskSourceError("the dataset is not a Parquet file", [str(error)]) from error
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    for number, row in enumerate(table.to_pylist(), start=1):
        try:  # only JSON values can be an item (dates, bytes and the like cannot)
            rows.append(json.loads(json.dumps(row, allow_nan=False)))
        except (TypeError, ValueError) as error:
            problems.append(f"row {number}: not JSON-serialisable ({error})")
    if problems:
        raise TaskSourceError(f"{len(problems)} malformed dataset row(s)", problems)
    return rows


def take_split_field(rows: Sequence[Mapping[str, Any]], field: str | None
                     ) -> tuple[list[dict[str, Any]], list[str | None]]:
    """Items without the split column, and each row's split (None without a field)."""
    if field is None:
        return [dict(row) for row in rows], [None] * len(rows)
    items, splits, problems = [], [], []
    for ordinal, row in enumerate(rows):
        value = row.get(field)
        if value not in SPLITS:
            problems.append(f"row {ordinal}: {field} is {value!r}, not one of "
                            f"{', '.join(SPLITS)}")
        items.append({k: v for k, v in row.items() if k != field})
        splits.append(value if isinstance(value, str) else None)
    if problems:
        raise TaskSourceError(f"{len(problems)} row(s) name no split", problems)
    return items, splits


def parse_seeds(text: str) -> list[int]:
    """``1,2,5-9`` as the seeds in that order (ranges inclusive), each once."""
    seeds: list[int] = []
    problems: list[str] = []
    for part in text.split(","):
        matched = _SEED_PART.match(part)
        if matched is None:
            problems.append(f"{part.strip()!r}: a seed is a number, a range is A-B")
            continue
        low = int(matched.group(1))
        high = int(matched.group(2)) if matched.group(2) is not None else low
        if high < low:
            problems.append(f"{part.strip()!r}: the range runs backwards")
            continue
        if high - low + len(seeds) >= MAX_TASKS:
            problems.append(f"{part.strip()!r}: at most {MAX_TASKS} seeds")
            break
        seeds.extend(range(low, high + 1))
    repeated = sorted(_repeated(seeds))
    problems += [f"seed {s} is listed more than once" for s in repeated]
    if problems or not seeds:
        raise TaskSourceError("the seeds cannot be used", problems or ["no seeds"])
    return seeds


def _repeated(values: Sequence[int]) -> set[int]:
    seen: set[int] = set()
    repeated: set[int] = set()
    for value in values:
        (repeated if value in seen else seen).add(value)
    return repeated


def split_rule_problems(rule: Mapping[str, Any], *, source_kind: str) -> list[str]:
    """What is wrong with a split rule (nothing: it can be applied)."""
    by = rule.get("by")
    if by == "fraction":
        unknown = sorted(set(rule) - {"by", *SPLITS})
        shares = [rule.get(split, 0) for split in SPLITS]
        problems = [f"fraction rule: unknown key {k!r}" for k in unknown]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
                   for v in shares):
            return [*problems, "fraction rule: each share is a number >= 0"]
        if not math.isclose(sum(shares), 1.0, abs_tol=1e-9):
            problems.append(f"fraction rule: the shares add up to {sum(shares)}, not 1")
        return problems
    if by == "list":
        unknown = sorted(set(rule) - {"by", "eval", "traffic"})
        problems = [f"list rule: unknown key {k!r} (train is the rest)" for k in unknown]
        for split in ("eval", "traffic"):
            value = rule.get(split, [])
            if not isinstance(value, list) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
                problems.append(f"list rule: {split} is a list of ordinals (integers >= 0)")
        if not problems:
            both = sorted(set(rule.get("eval", [])) & set(rule.get("traffic", [])))
            problems += [f"list rule: ordinal {o} is in both eval and traffic" for o in both]
        return problems
    if by == "field":
        if source_kind != "dataset":
            return ["field rule: only a dataset has columns to split by"]
        field = rule.get("field")
        if not isinstance(field, str) or not field:
            return ["field rule: name the dataset column, e.g. {\"by\": \"field\", "
                    "\"field\": \"split\"}"]
        return [f"field rule: unknown key {k!r}" for k in sorted(set(rule) - {"by", "field"})]
    return [f"split rule: by must be fraction, list or field, got {by!r}"]


def split_field(rule: Mapping[str, Any]) -> str | None:
    """The dataset column a field rule names."""
    return str(rule["field"]) if rule.get("by") == "field" else None


def assign_splits(rule: Mapping[str, Any], digests: Sequence[str],
                  field_splits: Sequence[str | None]) -> list[str]:
    """Each task's split under a (checked) rule, in ordinal order."""
    by = rule.get("by")
    if by == "field":
        return [str(split) for split in field_splits]
    if by == "list":
        problems = [f"list rule: ordinal {o} is beyond the last task ({len(digests) - 1})"
                    for split in ("eval", "traffic") for o in rule.get(split, [])
                    if o >= len(digests)]
        if problems:
            raise TaskSourceError("the split rule names tasks the set does not have", problems)
        chosen = {**dict.fromkeys(rule.get("eval", []), "eval"),
                  **dict.fromkeys(rule.get("traffic", []), "traffic")}
        return [chosen.get(ordinal, "train") for ordinal in range(len(digests))]
    # fraction: a task's place in [0, 1) comes from its digest, so the split of a task does
    # not depend on where it stands in the source, and equal content lands together
    bounds, total = [], 0.0
    for split in SPLITS:
        total += float(rule.get(split, 0))
        bounds.append((total, split))
    splits = []
    for digest in digests:
        place = int(digest[:16], 16) / 2**64
        splits.append(next((s for bound, s in bounds if place < bound), bounds[-1][1]))
    return splits


def duplicated_digests(digests: Sequence[str], splits: Sequence[str]) -> list[str]:
    """Each digest that more than one task has, naming their ordinals and splits."""
    where: dict[str, list[int]] = {}
    for ordinal, digest in enumerate(digests):
        where.setdefault(digest, []).append(ordinal)
    return [f"tasks {', '.join(str(o) for o in ordinals)} have one content digest {digest} "
            f"(splits {', '.join(splits[o] for o in ordinals)}): an item may appear once"
            for digest, ordinals in where.items() if len(ordinals) > 1]


def parse_tags(pairs: Sequence[str]) -> dict[str, str]:
    """``key=value`` strings as tags (the CLI's ``--tag``)."""
    tags: dict[str, str] = {}
    problems = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not value.strip():
            problems.append(f"{pair!r}: a tag is key=value")
            continue
        tags[key.strip()] = value.strip()
    if problems:
        raise TaskSourceError("the tags cannot be used", problems)
    return tags
