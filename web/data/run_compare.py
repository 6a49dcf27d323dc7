"""Several training runs side by side: who they are (a label a legend can show), how their
RUN.yaml configs differ, and their series, for ``/runs/compare``, ``GET /api/runs/compare``
and ``triloop train compare``.

The config diff is N-way: one row per dotted path (``rollout.group_size``) whose value is
not the same in every run, with each run's value in order. Mappings are walked key by key
and any other value (a list of task ids, a number) is compared whole by its canonical JSON,
so ``8`` and ``8.0`` differ as they do in the stored configs. It is not
``triloop.contract_diff``: that one aligns two documents' lists item by item to say what
changed from A to B, where a comparison wants one column per run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field
from sqlmodel import Session

from web.data.runs import MetricPoint, RunListed, run_detail, runs_listed

MIN_COMPARED, MAX_COMPARED = 2, 8
SHORT_ID = 8  # characters of a run id a label shows


class ComparedRun(RunListed):
    """One compared run: its label for legends, its config and its series."""

    label: str = Field(description="name (or short id) and submitter: what legends show")
    config: dict[str, Any]
    metrics: list[MetricPoint] = Field(description="its latest 500 iterations, oldest first")


class ConfigDifference(BaseModel):
    """One setting whose value is not the same in every compared run."""

    path: str = Field(description="dotted path in RUN.yaml, e.g. rollout.group_size")
    values: list[Any] = Field(description="each run's value, in the order of runs; null where "
                                          "its config lacks the setting (see present)")
    present: list[bool] = Field(description="whether each run's config has the setting")


class RunComparison(BaseModel):
    """The compared runs in the order asked, and how their configs differ."""

    runs: list[ComparedRun]
    config_differences: list[ConfigDifference]


class ComparisonRefused(ValueError):
    """A selection that cannot be compared; the message says what to change."""


class RunsNotFound(LookupError):
    """Ids in a selection that name no training run."""

    def __init__(self, run_ids: list[str]) -> None:
        self.run_ids = run_ids
        super().__init__("no training run " + ", ".join(repr(i) for i in run_ids))


def parse_run_ids(raw: Sequence[str]) -> list[str]:
    """Run ids from ``?ids=a,b,c`` (or repeated ``ids``), in order, each once."""
    ids: list[str] = []
    for part in raw:
        for one in part.split(","):
            if one.strip() and one.strip() not in ids:
                ids.append(one.strip())
    if not MIN_COMPARED <= len(ids) <= MAX_COMPARED:
        raise ComparisonRefused(
            f"compare {MIN_COMPARED} to {MAX_COMPARED} different runs; {len(ids)} given "
            "(ids=A,B,C: their ids, comma separated)")
    return ids


def run_labels(runs: Sequence[tuple[str, str, str]]) -> list[str]:
    """A legend label per (id, name, submitter): the name, or the short id when it has none,
    with the short id added where two runs share a name, and the submitter."""
    names = [name.strip() for _, name, _ in runs]
    labels = []
    for (run_id, _, submitter), name in zip(runs, names, strict=True):
        short = run_id[:SHORT_ID]
        if not name:
            shown = short
        elif names.count(name) > 1:
            shown = f"{name} · {short}"
        else:
            shown = name
        labels.append(f"{shown} ({submitter})")
    return labels


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)


def _leaves(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and value:
        for key in value:
            _leaves(value[key], f"{prefix}.{key}" if prefix else str(key), out)
    elif prefix:
        out[prefix] = value


def config_differences(configs: Sequence[Mapping[str, Any]]) -> list[ConfigDifference]:
    """The settings whose values differ between the configs, by path (pure)."""
    flat: list[dict[str, Any]] = []
    for config in configs:
        leaves: dict[str, Any] = {}
        _leaves(config, "", leaves)
        flat.append(leaves)
    paths = sorted({path for leaves in flat for path in leaves})
    differences = []
    for path in paths:
        present = [path in leaves for leaves in flat]
        seen = {_canonical(leaves[path]) if path in leaves else "\0absent" for leaves in flat}
        if len(seen) > 1:
            differences.append(ConfigDifference(
                path=path, values=[leaves.get(path) for leaves in flat], present=present))
    return differences


def compare_runs(*, session: Session, run_ids: list[str]) -> RunComparison:
    """The runs in this order, with their diff; refused naming any id that is no run's."""
    listed = runs_listed(session=session, run_ids=run_ids)
    if missing := [run_id for run_id in run_ids if run_id not in listed]:
        raise RunsNotFound(missing)
    details = []
    for run_id in run_ids:
        detail = run_detail(session=session, run_id=run_id)
        if detail is None:  # deleted between the two reads: runs are never deleted
            raise RunsNotFound([run_id])
        details.append(detail)
    labels = run_labels([(d.id, d.name, d.submitted_by) for d in details])
    runs = [ComparedRun(**listed[d.id].model_dump(), label=label, config=d.config,
                        metrics=d.metrics) for d, label in zip(details, labels, strict=True)]
    return RunComparison(runs=runs,
                         config_differences=config_differences([d.config for d in details]))
