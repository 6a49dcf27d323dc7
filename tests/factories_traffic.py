"""Production traffic for tests of what an open shadow or canary gate has counted: a
promotion at a gate, its routing slot, and requested episodes (paired or one-sided)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, text

from tests.factories import insert, make_eval_set, uid
from tests.factories_governance import write_episodes
from tests.factories_web import Person, SeededPromotion, make_promotion


def promotion_at_gate(engine: Engine, people: dict[str, Person], gate: str,
             spec: dict[str, Any]) -> SeededPromotion:
    """An open promotion at ``gate`` against its root as production, judged by ``spec``."""
    seeded = make_promotion(engine, submitted_by=people["engineer"].name, current_gate=gate)
    with engine.begin() as conn:
        conn.execute(text("UPDATE promotion SET baseline_checkpoint_id = :b WHERE id = :p"),
                     {"b": seeded.root_id, "p": seeded.promotion_id})
    threshold_id = uid("thr-")
    insert(engine, "threshold", id=threshold_id, name=threshold_id, version=1,
           eval_set_id=make_eval_set(engine, frozen=True), created_by="gov", spec=spec)
    insert(engine, "gate_result", id=uid("gate-"), promotion_id=seeded.promotion_id,
           gate="offline_eval", passed=True, reasons=["passed"], evidence={},
           threshold_id=threshold_id)
    return seeded


def hold_slot(engine: Engine, slot: str, seeded: SeededPromotion | None) -> None:
    """Route the slot to a promotion's candidate (None empties it), as governance does."""
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO routing (slot, checkpoint_id, share, promotion_id, updated_by, "
            "updated_at) VALUES (:s, :c, 0.1, :p, 'governance', now()) ON CONFLICT (slot) "
            "DO UPDATE SET checkpoint_id = :c, promotion_id = :p, updated_at = now()"),
            {"s": slot, "c": seeded.checkpoint_id if seeded else None,
             "p": seeded.promotion_id if seeded else None})


def write_shadow_pairs(engine: Engine, seeded: SeededPromotion, task_id: str, n: int) -> None:
    """n production episodes of the baseline, each with the candidate's shadow copy."""
    batch = uid("traffic-")
    rows = []
    for i in range(n):
        production = f"{batch}:{i}"
        rows.append({"id": production, "batch_id": batch, "task_id": task_id,
                     "checkpoint_id": seeded.root_id, "purpose": "production",
                     "group_id": production, "success": True})
        rows.append({"id": f"{production}:shadow", "batch_id": batch, "task_id": task_id,
                     "checkpoint_id": seeded.checkpoint_id, "purpose": "shadow",
                     "group_id": production, "success": True,
                     "outcome": {"shadow_of": production}})
    write_episodes(engine, rows, requester=engine, verifier=engine)


def write_served(engine: Engine, checkpoint_id: str, purpose: str, task_id: str, n: int) -> None:
    """n requested episodes a checkpoint served for one purpose."""
    batch = uid("traffic-")
    write_episodes(engine, [{"id": f"{batch}:{i}", "batch_id": batch, "task_id": task_id,
                             "checkpoint_id": checkpoint_id, "purpose": purpose,
                             "group_id": f"{batch}:{i}", "success": True} for i in range(n)],
                   requester=engine, verifier=engine)


def task_of(engine: Engine, seeded: SeededPromotion) -> str:
    """A task of the promotion's environment version."""
    with engine.begin() as conn:
        return str(conn.execute(text("SELECT id FROM task WHERE environment_version_id = :v "
                                     "LIMIT 1"), {"v": seeded.env_version_id}).scalar_one())
