"""Stored episodes for the transcript tests: a promotion's two eval arms, a run's training
batch, each episode with turns, its token sequence and (for judged ones) a verdict.

Rows are inserted as the owner (set-up only, as in ``tests/factories.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sqlalchemy import Engine, text

from tests.factories import insert, make_task, uid
from tests.factories_web import SeededPromotion, add_gate, make_promotion


def add_batch(engine: Engine, batch_id: str, purpose: str, episodes: dict[str, str], *,
              run_id: str | None = None, checkpoint_id: str | None = None) -> None:
    """A requested batch planning these episodes (id -> task)."""
    plan = {e: {"task_id": t, "seed": 0} for e, t in episodes.items()}
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO rollout_batch (id, purpose, checkpoint_id, run_id, requested_by,"
            " planned_episodes) VALUES (:i, :p, :c, :r, :by, CAST(:plan AS jsonb))"),
            {"i": batch_id, "p": purpose, "c": checkpoint_id, "r": run_id,
             "by": "learning" if purpose == "training" else "governance",
             "plan": json.dumps(plan)})


def add_episode(engine: Engine, *, episode_id: str, batch_id: str, task_id: str,
                checkpoint_id: str, purpose: str, success: bool, run_id: str | None = None,
                turns: int = 2, verdict: bool | None = None, status: str = "completed") -> None:
    """One episode of ``turns`` turns: two prompt tokens then two action tokens per turn."""
    insert(engine, "trajectory", id=episode_id, batch_id=batch_id, run_id=run_id,
           task_id=task_id, checkpoint_id=checkpoint_id, purpose=purpose,
           group_id=f"{batch_id}:0", sample_index=0, policy_version=0, status=status,
           success=success,
           total_reward=1.0 if success else -1.0, num_steps=turns,
           failure_reason=None if status != "failed" else "the model server went away",
           outcome={"verifier": {"reached_goal": success}, "outcome_reward": 1.0,
                    "sandbox": {"backend": "bubblewrap", "network": False}})
    token_ids, mask, logprobs = [], [], []
    for index in range(turns):
        start = len(token_ids)
        token_ids += [100 + index, 200 + index, 300 + index, 400 + index]
        mask += [0, 0, 1, 1]
        logprobs += [-0.5 - index, -0.25 - index]
        insert(engine, "step", trajectory_id=episode_id, index=index, prompt_start=0,
               observation_start=start, action_start=start + 2, action_end=start + 4,
               observation=f"turn {index}: you stand on F at (0,{index})",
               action_text=f"move right ({index})", done=index == turns - 1,
               feedback={"reward_terms": {
                   "valid_action": 0.1}}, reward=0.1)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO trajectory_sequence (trajectory_id, token_ids, action_mask,"
            " behaviour_logprobs, segment_starts) VALUES (:t, :ids, :mask, :lp, :seg)"),
            {"t": episode_id, "ids": token_ids, "mask": mask, "lp": logprobs, "seg": [0]})
    if verdict is not None:
        insert(engine, "verdict", trajectory_id=episode_id, batch_id=batch_id, success=verdict,
               total_reward=1.0 if verdict else -1.0, agrees=verdict == success,
               details={"terms": {"success": 1.0 if verdict else 0.0}})


@dataclass
class PromotionEpisodes:
    """A promotion at the audit gate with its offline eval's episodes on two tasks."""

    seeded: SeededPromotion
    tasks: list[str]
    candidate: dict[str, list[str]] = field(default_factory=dict)  # task -> [success, failure]
    baseline: dict[str, list[str]] = field(default_factory=dict)
    training: list[str] = field(default_factory=list)  # the run's iteration-3 episodes
    shadow: list[str] = field(default_factory=list)


def promotion_with_episodes(engine: Engine, *, submitted_by: str,
                            with_gate: bool = True) -> PromotionEpisodes:
    """A promotion at the audit gate, its eval arms (each task: a success and a failure per
    arm; the baseline's task 2 only fails), a shadow episode and a failed training batch."""
    seeded = make_promotion(engine, submitted_by=submitted_by, current_gate="audit")
    with engine.begin() as conn:
        conn.execute(text("UPDATE promotion SET baseline_checkpoint_id = :b WHERE id = :p"),
                     {"b": seeded.parent_id, "p": seeded.promotion_id})
    made = PromotionEpisodes(seeded, [make_task(engine), make_task(engine)])
    prefix = f"{seeded.workflow_id}-eval-{uid()}"
    arms = {"candidate": (seeded.checkpoint_id, made.candidate),
            "production": (seeded.parent_id, made.baseline)}
    for arm, (checkpoint, into) in arms.items():
        plan = {}
        for n, task in enumerate(made.tasks):
            into[task] = [f"{prefix}-{arm}:{n}:ok", f"{prefix}-{arm}:{n}:no"]
            plan.update(dict.fromkeys(into[task], task))
        add_batch(engine, f"{prefix}-{arm}", "eval", plan, checkpoint_id=checkpoint)
        for n, task in enumerate(made.tasks):
            ok, no = into[task]
            won = not (arm == "production" and n == 1)
            add_episode(engine, episode_id=ok, batch_id=f"{prefix}-{arm}", task_id=task,
                        checkpoint_id=checkpoint, purpose="eval", success=won, verdict=won)
            add_episode(engine, episode_id=no, batch_id=f"{prefix}-{arm}", task_id=task,
                        checkpoint_id=checkpoint, purpose="eval", success=False, verdict=False)
    if with_gate:
        add_gate(engine, seeded.promotion_id, "offline_eval", evidence={
            "batches_bound": {"candidate": f"{prefix}-candidate",
                              "production": f"{prefix}-production"}})
    traffic = uid("traffic-")
    shadow = f"{traffic}:0:shadow"
    add_batch(engine, traffic, "production", {f"{traffic}:0": made.tasks[0]})
    add_episode(engine, episode_id=shadow, batch_id=traffic, task_id=made.tasks[0],
                checkpoint_id=seeded.checkpoint_id, purpose="shadow", success=True)
    made.shadow.append(shadow)
    training_task = make_task(engine)
    batch = f"{seeded.run_id}-3-{uid()}"
    made.training = [f"{batch}:0:{i}" for i in range(2)]
    add_batch(engine, batch, "training", dict.fromkeys(made.training, training_task),
              run_id=seeded.run_id)
    for episode in made.training:
        add_episode(engine, episode_id=episode, batch_id=batch, task_id=training_task,
                    checkpoint_id=seeded.parent_id, purpose="training", success=False,
                    run_id=seeded.run_id, status="failed", turns=1)
    return made
