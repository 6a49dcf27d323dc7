"""Checkpoints and their lineage: the parent chain from the base model to a candidate.

Each node carries what an auditor needs to trace it: the run that produced it,
the environment versions (with their hashes) and the data it saw; the
candidate's promotions add the frozen eval sets its gates used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlmodel import Session, col, select

from triloop.models import (
    Checkpoint,
    Deployment,
    EnvironmentVersion,
    EvalSet,
    GateResult,
    Promotion,
    TrainingRun,
)
from web.pagination import Page, keyset, page_of

MAX_DEPTH = 64


class CheckpointPublic(BaseModel):
    """A checkpoint: id is the sha256 of its weights."""

    model_config = ConfigDict(from_attributes=True)
    id: str
    parent_id: str | None = None
    run_id: str | None = None
    base_model: str
    iteration: int | None = None
    environment_version_ids: list[str]
    data: dict[str, Any]
    artifact_uri: str
    created_by: str
    created_at: datetime
    # What the weights are served with (sha256 hex of each; see learning_loop.checkpoints).
    tokenizer_sha256: str | None = None
    model_config_sha256: str | None = None
    chat_template_sha256: str | None = None
    # An imported base model's facts (NULL on checkpoints triloop trained).
    name: str | None = None
    source_kind: str | None = Field(default=None, description="huggingface | gguf")
    parameter_count: int | None = None
    source_dtype: str | None = Field(default=None, description="the weights' dtype at the source")
    dtype: str | None = Field(default=None, description="the dtype the weights are stored in")
    # Retention: when its weights and trainer state were deleted and by which rule (the
    # row and its digests remain); None while its files are kept.
    pruned_at: datetime | None = None
    pruned_rule: str | None = None


class EnvironmentRef(BaseModel):
    """An environment version named by its contract hash."""

    id: str
    environment_name: str
    version: int


class RunRef(BaseModel):
    """The run that produced a checkpoint."""

    id: str
    name: str
    submitted_by: str


class EvalSetRef(BaseModel):
    """A frozen eval set a gate used."""

    id: str
    name: str
    version: int
    content_hash: str | None = None


class PromotionRef(BaseModel):
    """A promotion of the candidate."""

    id: str
    status: str
    current_gate: str | None = None


class LineageNode(BaseModel):
    """One checkpoint in the chain with its run and environment versions."""

    checkpoint: CheckpointPublic
    run: RunRef | None = None
    environments: list[EnvironmentRef]
    aliases: list[str]


class Lineage(BaseModel):
    """The chain from the root (base model) to the candidate, and how it was judged."""

    candidate_id: str
    base_model: str
    chain: list[LineageNode]
    truncated: bool
    promotions: list[PromotionRef]
    eval_sets: list[EvalSetRef]


def list_checkpoints(
    *, session: Session, limit: int, cursor: str | None, run_id: str | None = None,
    id_prefix: str | None = None, name: str | None = None, bases: bool = False,
) -> Page[CheckpointPublic]:
    """Checkpoints, newest first: of one run, starting with an id prefix, of one name, or
    only bases (roots: imported models and the directories runs started from)."""
    statement = select(Checkpoint)
    if run_id is not None:
        statement = statement.where(Checkpoint.run_id == run_id)
    if id_prefix is not None:
        statement = statement.where(col(Checkpoint.id).startswith(id_prefix, autoescape=True))
    if name is not None:
        statement = statement.where(Checkpoint.name == name)
    if bases:
        statement = statement.where(col(Checkpoint.parent_id).is_(None))
    statement = keyset(statement, [col(Checkpoint.created_at), col(Checkpoint.id)], cursor,
                       (datetime, str), limit)
    rows = list(session.exec(statement))
    return page_of(rows, limit, lambda c: (c.created_at, c.id), CheckpointPublic.model_validate)


def get_checkpoint(*, session: Session, checkpoint_id: str) -> CheckpointPublic | None:
    """One checkpoint."""
    row = session.get(Checkpoint, checkpoint_id)
    return None if row is None else CheckpointPublic.model_validate(row)


def checkpoint_by_name(*, session: Session, name: str) -> CheckpointPublic | None:
    """The checkpoint with this (unique) name."""
    row = session.exec(select(Checkpoint).where(Checkpoint.name == name)).first()
    return None if row is None else CheckpointPublic.model_validate(row)


_HEX_PREFIX = re.compile(r"^[0-9a-f]{6,63}$")


@dataclass(frozen=True)
class BaseModelRef:
    """What RUN.yaml's ``model.base`` names: a registered checkpoint, or a directory."""

    checkpoint_id: str | None  # None: a model directory the learning worker registers
    problem: str | None = None  # why it names nothing (unknown, or an ambiguous prefix)


def looks_like_path(ref: str) -> bool:
    """A model directory rather than a checkpoint's id or name (names hold no slash)."""
    return "/" in ref or ref.startswith((".", "~"))


def resolve_base(*, session: Session, ref: str) -> BaseModelRef:
    """``model.base`` as a checkpoint id: an id, a name, or a unique id prefix (6+ hex
    digits); a path is left to the learning worker; anything else names the problem."""
    if session.get(Checkpoint, ref) is not None:
        return BaseModelRef(ref)
    if looks_like_path(ref):
        return BaseModelRef(None)
    named = checkpoint_by_name(session=session, name=ref)
    if named is not None:
        return BaseModelRef(named.id)
    if _HEX_PREFIX.match(ref):
        ids = list(session.exec(select(Checkpoint.id).where(
            col(Checkpoint.id).startswith(ref)).order_by(col(Checkpoint.id)).limit(4)))
        if len(ids) == 1:
            return BaseModelRef(ids[0])
        if ids:
            return BaseModelRef(None, f"model.base {ref!r} is the start of several checkpoint"
                                f" ids ({', '.join(i[:16] for i in ids)}...); give more of it")
    return BaseModelRef(None, (
        f"model.base {ref!r} names no registered checkpoint (by id, unique id prefix or name);"
        " `triloop model list` shows the bases, `triloop model import` adds one, or give a"
        " model directory's path"))


def lineage(*, session: Session, checkpoint_id: str) -> Lineage | None:
    """The parent chain of a checkpoint, root first, with runs, environments and eval sets."""
    chain: list[Checkpoint] = []
    current = session.get(Checkpoint, checkpoint_id)
    if current is None:
        return None
    seen: set[str] = set()
    while current is not None and current.id not in seen and len(chain) < MAX_DEPTH:
        chain.append(current)
        seen.add(current.id)
        current = session.get(Checkpoint, current.parent_id) if current.parent_id else None
    truncated = current is not None
    chain.reverse()
    run_ids = {c.run_id for c in chain if c.run_id}
    runs = {
        r.id: r for r in session.exec(select(TrainingRun).where(col(TrainingRun.id).in_(run_ids)))
    }
    env_ids = {e for c in chain for e in c.environment_version_ids}
    envs = {
        e.id: e for e in session.exec(
            select(EnvironmentVersion).where(col(EnvironmentVersion.id).in_(env_ids))
        )
    }
    aliases: dict[str, list[str]] = {}
    for deployment in session.exec(select(Deployment)):
        aliases.setdefault(deployment.checkpoint_id, []).append(deployment.alias)
    nodes = [_node(c, runs, envs, aliases) for c in chain]
    promotions = list(session.exec(
        select(Promotion).where(Promotion.checkpoint_id == checkpoint_id)
        .order_by(col(Promotion.created_at))
    ))
    eval_ids = {
        g.eval_set_id for g in session.exec(
            select(GateResult).where(col(GateResult.promotion_id).in_([p.id for p in promotions]))
        ) if g.eval_set_id
    }
    eval_sets = session.exec(select(EvalSet).where(col(EvalSet.id).in_(eval_ids)))
    return Lineage(
        candidate_id=checkpoint_id,
        base_model=chain[0].base_model,
        chain=nodes,
        truncated=truncated,
        promotions=[PromotionRef(id=p.id, status=p.status, current_gate=p.current_gate)
                    for p in promotions],
        eval_sets=[EvalSetRef(id=e.id, name=e.name, version=e.version,
                              content_hash=e.content_hash) for e in eval_sets],
    )


def _node(
    checkpoint: Checkpoint, runs: dict[str, TrainingRun], envs: dict[str, EnvironmentVersion],
    aliases: dict[str, list[str]],
) -> LineageNode:
    run = runs.get(checkpoint.run_id or "")
    return LineageNode(
        checkpoint=CheckpointPublic.model_validate(checkpoint),
        run=None if run is None else RunRef(id=run.id, name=run.name,
                                            submitted_by=run.submitted_by),
        environments=[
            EnvironmentRef(id=e.id, environment_name=e.environment_name, version=e.version)
            for e in (envs.get(i) for i in checkpoint.environment_version_ids) if e is not None
        ],
        aliases=sorted(aliases.get(checkpoint.id, [])),
    )


# A run's iterations shown one by one up to this many; longer runs show their first and
# last and fold the ones between (16 iterations made a 3,776 px page).
MAX_SHOWN_OF_A_RUN = 3


@dataclass(frozen=True)
class LineageSegment:
    """What the lineage page draws in one place: one node, or a run's folded iterations."""

    node: LineageNode | None = None
    folded: tuple[LineageNode, ...] = ()


def segments(found: Lineage) -> list[LineageSegment]:
    """The chain after its base (the root, drawn once as the base model), each run's
    consecutive iterations folded between its first and last; a node with an alias or the
    candidate is never folded away."""
    body = found.chain[1:] if found.chain and found.chain[0].checkpoint.parent_id is None \
        else found.chain
    out: list[LineageSegment] = []
    start = 0
    while start < len(body):
        end = start
        run_id = body[start].checkpoint.run_id
        while end + 1 < len(body) and run_id and body[end + 1].checkpoint.run_id == run_id:
            end += 1
        out.extend(_fold(body[start:end + 1], found.candidate_id))
        start = end + 1
    return out


def _fold(run: list[LineageNode], candidate_id: str) -> list[LineageSegment]:
    if len(run) <= MAX_SHOWN_OF_A_RUN:
        return [LineageSegment(node=n) for n in run]
    out = [LineageSegment(node=run[0])]
    folded: list[LineageNode] = []
    for node in run[1:-1]:
        if node.aliases or node.checkpoint.id == candidate_id:
            if folded:
                out.append(LineageSegment(folded=tuple(folded)))
                folded = []
            out.append(LineageSegment(node=node))
        else:
            folded.append(node)
    if folded:
        out.append(LineageSegment(folded=tuple(folded)))
    out.append(LineageSegment(node=run[-1]))
    return out
