"""An operator registers a task set: the request checked here, the set written by governance.

The same path as every governance write (``web.governance_writes``): OPA for the person
(``create task_set``), the source and split rule checked (422, every problem named, nothing
recorded), a ``human_decision`` recorded, then governance's ``TaskSetRegistration`` run to
the end. A dataset file is read here only to check its rows, then put in the artifact
store: the decision, the workflow and the Nexus request carry its sha256, never its rows.
What only the environment can say (an item it refuses, an environment without a
generator) and what only the whole set shows (one item twice) come back from governance as
a 422, with the decision on record and nothing else written.
"""

from __future__ import annotations

import base64
import binascii
from collections import Counter
from typing import Any

from pydantic import BaseModel, Field, model_validator

from triloop.artifact_backends import open_store
from triloop.statuses import Decision, DecisionKind
from triloop.task_sources import (
    TaskSourceError,
    dataset_format,
    dataset_rows,
    split_field,
    split_rule_problems,
    take_split_field,
)
from triloop.workflow_api import (
    GovernanceWriteInput,
    task_set_admission_workflow_id,
    task_set_registration_workflow_id,
)
from web.data import decisions
from web.deps import Guard, Sessions, WebServices
from web.problems import invalid

NAME = r"^[a-z0-9][a-z0-9_.-]{0,99}$"


class DatasetFile(BaseModel):
    """A dataset file as uploaded: its name (.jsonl or .parquet) and its bytes in base64."""

    filename: str = Field(min_length=1, max_length=300)
    content_base64: str = Field(min_length=1)


class TaskSetRegistrationBody(BaseModel):
    """A task set to register: one source, a split rule and the set's tags."""

    name: str = Field(pattern=NAME, description="the set's name (lower case); versions count up")
    environment: str = Field(min_length=1, max_length=200,
                             description="the environment version: NAME@N, NAME (newest) or id")
    dataset: DatasetFile | None = Field(default=None, description="one item per row")
    generator: dict[str, Any] | None = Field(
        default=None, description="the environment's generator's params (count required)")
    seeds: list[int] | None = Field(default=None, max_length=100_000,
                                    description="seeds, each once")
    split: dict[str, Any] = Field(description='e.g. {"by": "fraction", "train": 0.8, '
                                              '"eval": 0.1, "traffic": 0.1}')
    tags: dict[str, str] = Field(default_factory=dict, max_length=50,
                                 description="the set's tags, over the generator's own")
    comment: str = Field(default="", max_length=2000, description="why (optional)")

    @model_validator(mode="after")
    def _one_source(self) -> TaskSetRegistrationBody:
        given = [s for s in ("dataset", "generator", "seeds") if getattr(self, s) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one source of dataset, generator or seeds, "
                             f"got {', '.join(given) or 'none'}")
        return self

    @property
    def source_kind(self) -> str:
        """dataset, generator or seeds."""
        return "dataset" if self.dataset else "generator" if self.generator else "seeds"


class TaskSetRegistered(BaseModel):
    """The set governance stored (or the one that already holds identical content)."""

    task_set_id: str
    name: str
    version: int
    created: bool = Field(description="false: identical content was already registered")
    splits: dict[str, int] = Field(description="members per split")
    new_tasks: int = Field(description="tasks created (the rest were already registered)")
    decision_id: str
    workflow_id: str
    admission_workflow_id: str = Field(description="the set's admission, started at once")


def _source(*, body: TaskSetRegistrationBody, services: WebServices
            ) -> tuple[dict[str, Any], list[str]]:
    """The source as the decision records it, and its problems (a dataset is stored)."""
    kind = body.source_kind
    problems = split_rule_problems(body.split, source_kind=kind)
    if kind == "seeds":
        seeds = list(body.seeds or [])
        repeated = sorted(s for s, n in Counter(seeds).items() if n > 1)
        problems += [f"seed {s} is listed more than once" for s in repeated]
        problems += ["no seeds"] if not seeds else []
        problems += [f"seed {s} is negative" for s in seeds if s < 0][:10]
        return {"seeds": seeds}, problems
    if kind == "generator":
        params = dict(body.generator or {})
        count = params.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            problems.append(f"generator params need a positive integer count, got {count!r}")
        return {"params": params}, problems
    assert body.dataset is not None
    try:
        data = base64.b64decode(body.dataset.content_base64, validate=True)
    except (binascii.Error, ValueError) as error:
        return {}, [*problems, f"dataset.content_base64 is not base64: {error}"]
    try:
        fmt = dataset_format(body.dataset.filename)
        rows = dataset_rows(data, fmt)
        take_split_field(rows, split_field(body.split) if not problems else None)
    except TaskSourceError as error:
        return {}, [*problems, *error.problems]
    digest = open_store(services.settings).put_bytes(data)
    return {"sha256": digest, "format": fmt, "filename": body.dataset.filename,
            "rows": len(rows)}, problems


async def register_task_set(
    *, guard: Guard, db: Sessions, services: WebServices, body: TaskSetRegistrationBody
) -> TaskSetRegistered:
    """Check the source, record the operator's decision and have governance register it."""
    await guard("create", "task_set", attrs={"name": body.name})
    source, problems = await services.validation.run(
        "the task set's source", _source, body=body, services=services)
    if problems:
        raise invalid(f"the task set has {len(problems)} problem(s)", problems)
    decision_id = await db.write(
        decisions.record_decision, kind=DecisionKind.TASK_SET, subject=body.name,
        decision=Decision.REGISTER, user=guard.principal.name, comment=body.comment.strip(),
        details={"environment_version": body.environment, "source_kind": body.source_kind,
                 "source": source, "split_rule": body.split, "tags": body.tags},
        credential=guard.principal.credential)
    workflow_id = task_set_registration_workflow_id(decision_id)
    result = await services.orchestrator.register_task_set(
        GovernanceWriteInput(decision_id=decision_id, kind=DecisionKind.TASK_SET.value,
                             subject=body.name), workflow_id, user=guard.principal.name)
    return TaskSetRegistered(
        task_set_id=result.id, name=result.name, version=result.version, created=result.created,
        splits={str(k): int(v) for k, v in (result.details.get("splits") or {}).items()},
        new_tasks=int(result.details.get("new_tasks") or 0), decision_id=decision_id,
        workflow_id=workflow_id, admission_workflow_id=task_set_admission_workflow_id(result.id))
