"""Promotion activities that judge evidence: offline eval, shadow, canary and watch looks.

Each reads episodes the execution loop wrote, hands plain numbers to the pure
gate in ``governance_loop.gates`` and stores final verdicts (``continue`` looks
store nothing, so a long soak does not fill ``gate_result``). Shadow, canary and
watch read production traffic, which an operator's game-day fault may have
degraded: each decides on all episodes and on those no fault touched, and
``without_fault_passes`` lets the faulted ones fail a candidate, never pass it.
(Eval batches are never faulted.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session
from temporalio import activity
from temporalio.exceptions import ApplicationError

from governance_loop import gate_windows as episodes
from governance_loop import store
from governance_loop.activity_support import (
    GovernanceShell,
    outcome_of,
    parse_time,
    store_gate,
)
from governance_loop.contracts import (
    DECIDE_OFFLINE_EVAL,
    DECIDE_SHADOW,
    LOOK_CANARY,
    LOOK_WATCH,
    CanaryLook,
    GateOutcome,
    OfflineEvalInput,
    ShadowInput,
    WatchLook,
)
from governance_loop.evalsets import candidate_eval_sets, content_hash_problem
from governance_loop.gates import (
    AuditEpisodes,
    BinomialCounts,
    CanaryObservation,
    EpisodeStats,
    EvalSetResult,
    GateDecision,
    PlaceboArm,
    RewardSummary,
    ShadowSample,
    ThresholdSpec,
    Verdict,
    attribute,
    decide_canary,
    decide_offline_eval,
    decide_shadow,
    decide_watch_against_baselines,
    without_fault_passes,
)
from triloop import held_out
from triloop.audit import record_event
from triloop.db import session_scope
from triloop.models import EvalSet, Threshold
from triloop.policy import Authorizer, Resource
from triloop.production_traffic import CANARY_PURPOSES, VERIFIER_ROLE
from triloop.statuses import Gate, Purpose
from triloop.weights import INTEGRITY_ACTION


def _spec(session: Session, threshold_id: str) -> ThresholdSpec:
    row = session.get(Threshold, threshold_id)
    if row is None:
        raise store.StoreError(f"threshold {threshold_id} does not exist")
    return ThresholdSpec.from_mapping(row.spec)


def _stats(outcomes: episodes.Outcomes) -> EpisodeStats:
    return EpisodeStats.from_outcomes(outcomes.successes, outcomes.rewards)


VERIFIER_BEHIND = "VerifierBehind"


def await_verdicts(unjudged_now: Callable[[], list[str]], *, wait_s: float,
                   poll_s: float = 0.25, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Wait (heartbeating) until ``unjudged_now()`` (episodes the verifier has not judged)
    is empty, for at most ``wait_s`` seconds; return the episodes still unjudged.

    A verifier that judged some but not all in that time is behind, not gone (a loaded
    machine): that raises a retryable ``VerifierBehind`` error, so the activity tries again
    instead of failing the gate. Only a wait in which it judged nothing returns a remainder.
    """
    deadline = clock() + wait_s
    at_start: int | None = None
    while True:
        unjudged = unjudged_now()
        at_start = len(unjudged) if at_start is None else at_start
        if not unjudged:
            return unjudged
        if clock() >= deadline:
            if len(unjudged) < at_start:
                raise ApplicationError(
                    f"the verifier is still judging: {at_start - len(unjudged)} episodes "
                    f"judged in the last {wait_s:g} s, {len(unjudged)} to go; trying again",
                    type=VERIFIER_BEHIND)
            return unjudged
        if activity.in_activity():
            activity.heartbeat(len(unjudged))
        sleep(poll_s)


def _unjudged_decision(spec: ThresholdSpec, unjudged: list[str]) -> GateDecision:
    return GateDecision(
        gate=Gate.OFFLINE_EVAL, passed=False, verdict=Verdict.FAIL,
        # The episodes are in the evidence (the console links them), not in a person's reason.
        reasons=[f"the verifier has not judged {len(unjudged)} episodes of the eval batches, "
                 "and judged none while offline eval waited; offline eval counts only its "
                 "verdicts: is the verifier running (`python -m verifier`, `triloop dev up`)?"],
        evidence={"threshold_version": spec.version, "unjudged": unjudged[:50]},
    )


def _placebo_arm(request: OfflineEvalInput, spec: ThresholdSpec,
                 run_id: str) -> PlaceboArm | None:
    """The placebo arm when the threshold requires it for production (None: it does not);
    without a placebo batch (no placebo run when the promotion opened) it names no run, and
    the gate fails saying how to make one."""
    if not spec.placebo.required_for(Purpose.PRODUCTION):
        return None
    if request.placebo_batch_id is None or request.placebo_checkpoint_id is None:
        return PlaceboArm(candidate_run_id=run_id, alias=Purpose.PRODUCTION)
    return PlaceboArm(candidate_run_id=run_id, alias=Purpose.PRODUCTION,
                      run_id=request.placebo_run_id, checkpoint_id=request.placebo_checkpoint_id)
def _recorded_attribution(session: Session, spec: ThresholdSpec,
                          candidate: episodes.WindowTerms,
                          production: episodes.WindowTerms) -> dict[str, Any]:
    """A window gate's split of candidate vs production reward by term: recorded for the
    auditor, never a reason to fail (only offline eval holds a shaping-only gain)."""
    tasks = sorted(set(candidate.task_ids) | set(production.task_ids))
    found = attribute(candidate.episodes, production.episodes,
                      process_terms=episodes.process_terms(session=session, task_ids=tasks),
                      success_rate_delta=candidate.success_rate - production.success_rate,
                      min_task_share=spec.attribution.min_task_share)
    return {**found.to_dict(), "episodes": {"candidate": len(candidate.episodes),
                                            "production": len(production.episodes)}}


class EvidenceActivities(GovernanceShell):
    """Reads episodes and decides gates; writes only ``gate_result`` rows and audit events.

    ``verdict_wait_s``: how long offline eval waits for the verifier's verdicts (seconds).
    """

    def __init__(self, engine: Engine, authorizer: Authorizer, *,
                 verdict_wait_s: float = 40.0) -> None:
        super().__init__(engine, authorizer)
        self._verdict_wait_s = verdict_wait_s

    def _store(
        self, session: Session, promotion_id: str, decision: GateDecision, *,
        threshold_id: str | None, eval_set_id: str | None = None,
    ) -> GateOutcome:
        self.authorize("create", Resource("gate_result", attrs={
            "promotion_id": promotion_id, "gate": decision.gate}))
        return store_gate(session, promotion_id=promotion_id, decision=decision,
                          threshold_id=threshold_id, eval_set_id=eval_set_id)

    def _judge_windows(
        self, session: Session, promotion_id: str, decide: Callable[[bool], GateDecision], *,
        threshold_id: str, windows: list[episodes.Window],
        attribution: Callable[[], dict[str, Any]] | None = None,
    ) -> GateOutcome:
        """A window gate's look: its verdict over every episode, and over the clean ones when
        an injected fault served some (a fault may fail a gate, never pass it); a final
        verdict is stored, with ``attribution()`` in its evidence when given."""
        faulted = episodes.fault_summary(session=session, windows=windows)
        everything = decide(False)
        decision = without_fault_passes(
            all_episodes=everything,
            clean_episodes=decide(True) if faulted.faults else everything,
            faults=faulted.faults, faulted_episodes=faulted.episodes,
        )
        if not decision.final:
            return outcome_of(decision)
        if attribution is not None:
            decision.evidence["attribution"] = attribution()
        return self._store_window_gate(session, promotion_id, decision,
                                       threshold_id=threshold_id, windows=windows)

    def _store_window_gate(
        self, session: Session, promotion_id: str, decision: GateDecision, *,
        threshold_id: str, windows: list[episodes.Window],
    ) -> GateOutcome:
        """Store a window gate's final verdict, saying how many episodes in its windows no
        requested batch vouched for: they were never counted, and each such finding is an
        audited integrity event."""
        left_out = episodes.unrequested_episodes(session=session, windows=windows)
        decision.evidence["left_out_unrequested"] = left_out.episodes
        if left_out.episodes:
            record_event(self._engine, actor={"service": "governance", "roles": []},
                         action=INTEGRITY_ACTION,
                         resource={"kind": "promotion", "id": promotion_id},
                         payload={"during": decision.gate,
                                  "problem": f"{left_out.episodes} episodes outside any "
                                             "requested batch; not counted",
                                  "examples": left_out.examples})
        return self._store(session, promotion_id, decision, threshold_id=threshold_id)

    @activity.defn(name=DECIDE_OFFLINE_EVAL.name)
    def decide_offline_eval(self, request: OfflineEvalInput) -> GateOutcome:
        """Judge both eval batches on each frozen eval set against the threshold version.

        The batches play every eval set's tasks; each set is judged on its own tasks'
        episodes, and the gate passes only when every set meets the thresholds.
        """
        self.own(request.promotion_id, "decide_offline_eval")
        with session_scope(self._engine) as session:
            spec = _spec(session, request.threshold_id)
            eval_sets: list[EvalSet] = []
            for eval_set_id in request.eval_set_ids or [request.eval_set_id]:
                eval_set = session.get(EvalSet, eval_set_id)
                if eval_set is None or eval_set.content_hash is None:
                    raise store.StoreError(f"eval set {eval_set_id} is missing or not frozen")
                eval_sets.append(eval_set)
            tampered = [p for p in (content_hash_problem(session=session, eval_set=e)
                                    for e in eval_sets) if p is not None]
            if tampered:
                decision = GateDecision(
                    gate=Gate.OFFLINE_EVAL, passed=False, verdict=Verdict.FAIL, reasons=tampered,
                    evidence={"threshold_version": spec.version,
                              "eval_set_content_hash": eval_sets[0].content_hash,
                              "eval_set_content_hashes": {e.id: e.content_hash
                                                          for e in eval_sets}},
                )
            elif request.batch_errors:
                decision = GateDecision(
                    gate=Gate.OFFLINE_EVAL, passed=False, verdict=Verdict.FAIL,
                    reasons=[f"offline eval did not run: {e}" for e in request.batch_errors],
                    evidence={"threshold_version": spec.version},
                )
            else:
                decision = self._judge_eval_batches(session, request, spec, eval_sets)
            return self._store(session, request.promotion_id, decision,
                               threshold_id=request.threshold_id,
                               eval_set_id=request.eval_set_id)

    def _judge_eval_batches(self, session: Session, request: OfflineEvalInput,
                            spec: ThresholdSpec, eval_sets: list[EvalSet]) -> GateDecision:
        """Count only episodes of batches governance asked for, served by the arm's checkpoint.

        Anything else (a batch requested by someone else or for another checkpoint, an
        episode another checkpoint served) is left out, fails the gate, and is audited as
        an integrity event.
        """
        promotion = store.get_promotion(session=session, promotion_id=request.promotion_id)
        trained_on = held_out.training_tasks(session, run_id=promotion.run_id)
        tasks_of = {e.id: [t for t, _, _ in store.eval_set_tasks(session=session,
                                                                 eval_set_id=e.id)]
                    for e in eval_sets}
        judged_on = sorted({t for tasks in tasks_of.values() for t in tasks})
        shared = held_out.overlaps(session=session, training=trained_on, evaluation=judged_on)
        held_out_evidence = {"run_id": promotion.run_id, "training_tasks": len(trained_on),
                             "eval_tasks": len(judged_on),
                             "overlaps": [o.describe() for o in shared],
                             "content_digests": held_out.digest_check(
                                 session=session, training=trained_on, evaluation=judged_on)}
        if shared:
            return GateDecision(
                gate=Gate.OFFLINE_EVAL, passed=False, verdict=Verdict.FAIL,
                reasons=[f"not held out: {o.describe()}" for o in shared],
                evidence={"threshold_version": spec.version, "held_out": held_out_evidence},
            )
        placebo = _placebo_arm(request, spec, promotion.run_id)
        placebo_batch = request.placebo_batch_id if placebo is not None else None
        batch_ids = [b for b in (request.candidate_batch_id, request.production_batch_id,
                                 placebo_batch) if b]
        unjudged = await_verdicts(
            lambda: episodes.unjudged_episodes(session=session, batch_ids=batch_ids),
            wait_s=self._verdict_wait_s)
        if unjudged:
            return _unjudged_decision(spec, unjudged)
        candidate = episodes.requested_batch_outcomes(
            session=session, batch_id=request.candidate_batch_id,
            checkpoint_id=promotion.checkpoint_id)
        production = None
        problems = list(candidate.problems)
        with_production = (request.production_batch_id is not None
                           and promotion.baseline_checkpoint_id is not None)
        if with_production:
            production = episodes.requested_batch_outcomes(
                session=session, batch_id=request.production_batch_id or "",
                checkpoint_id=promotion.baseline_checkpoint_id or "")
            problems += production.problems
        if placebo is not None and placebo.checkpoint_id is not None:
            problems += episodes.requested_batch_outcomes(
                session=session, batch_id=request.placebo_batch_id or "",
                checkpoint_id=placebo.checkpoint_id).problems
        if problems:
            for problem in problems:
                record_event(self._engine, actor={"service": "governance", "roles": []},
                             action=INTEGRITY_ACTION,
                             resource={"kind": "promotion", "id": request.promotion_id},
                             payload={"during": Gate.OFFLINE_EVAL, "problem": problem})
            return GateDecision(
                gate=Gate.OFFLINE_EVAL, passed=False, verdict=Verdict.FAIL,
                reasons=[f"integrity: {problem}" for problem in problems],
                evidence={"threshold_version": spec.version, "integrity": problems},
            )
        results, placebo_sets = [], {}
        for eval_set in eval_sets:  # each set on its own tasks' episodes of the two batches
            own = tasks_of[eval_set.id]
            label = f"{eval_set.name}@v{eval_set.version}"
            if placebo is not None and placebo.checkpoint_id is not None:
                placebo_sets[label] = _stats(episodes.requested_batch_outcomes(
                    session=session, batch_id=request.placebo_batch_id or "",
                    checkpoint_id=placebo.checkpoint_id, task_ids=own).outcomes)
            mine = episodes.requested_batch_outcomes(
                session=session, batch_id=request.candidate_batch_id,
                checkpoint_id=promotion.checkpoint_id, task_ids=own)
            theirs = None if not with_production else episodes.requested_batch_outcomes(
                session=session, batch_id=request.production_batch_id or "",
                checkpoint_id=promotion.baseline_checkpoint_id or "", task_ids=own)
            results.append(EvalSetResult(
                eval_set=label,
                eval_set_version=eval_set.content_hash or "",
                candidate=_stats(mine.outcomes),
                production=None if theirs is None else _stats(theirs.outcomes),
                candidate_terms=episodes.episode_terms(
                    session=session, batch_id=request.candidate_batch_id,
                    checkpoint_id=promotion.checkpoint_id, task_ids=own),
                production_terms=None if not with_production else episodes.episode_terms(
                    session=session, batch_id=request.production_batch_id or "",
                    checkpoint_id=promotion.baseline_checkpoint_id or "", task_ids=own),
                process_terms=episodes.process_terms(session=session, task_ids=own),
            ))
        # The shortcut audit: both arms' behaviour on every judged eval task.
        audit = AuditEpisodes(
            candidate=episodes.requested_batch_behaviour(
                session=session, batch_id=request.candidate_batch_id,
                checkpoint_id=promotion.checkpoint_id, task_ids=judged_on),
            baseline=None if not with_production else episodes.requested_batch_behaviour(
                session=session, batch_id=request.production_batch_id or "",
                checkpoint_id=promotion.baseline_checkpoint_id or "", task_ids=judged_on))
        if placebo is not None:
            placebo = replace(placebo, eval_sets=placebo_sets)
        decision = decide_offline_eval(results, spec, audit=audit, placebo=placebo)
        threshold = session.get(Threshold, request.threshold_id)
        if threshold is not None:  # which environment trained on each judged set stands for
            decision.evidence["judged_for"] = candidate_eval_sets(
                session=session, threshold=threshold, run_id=promotion.run_id).by_environment
        decision.evidence["held_out"] = held_out_evidence
        decision.evidence["batches_bound"] = {
            "candidate": request.candidate_batch_id, "production": request.production_batch_id,
            **({"placebo": request.placebo_batch_id} if placebo is not None else {}),
            "requested_by": "governance", "judged_by": VERIFIER_ROLE}
        return decision

    @activity.defn(name=DECIDE_SHADOW.name)
    def decide_shadow(self, request: ShadowInput) -> GateOutcome:
        """Judge the shadow soak on paired production/shadow episodes."""
        self.own(request.promotion_id, "decide_shadow")
        since = parse_time(request.since)
        windows: list[episodes.Window] = [
            (request.candidate_checkpoint_id, (Purpose.SHADOW,), since, None),
            (request.production_checkpoint_id, (Purpose.PRODUCTION,), since, None)]
        with session_scope(self._engine) as session:
            spec = _spec(session, request.threshold_id)
            # The soak is over: what it served until now is judged before the pairs are
            # counted (traffic goes on meanwhile; an episode still unjudged after the wait is
            # left out, as an unpaired one is).
            now = store.db_now(session)
            served = [(c, p, start, now) for c, p, start, _ in windows]
            await_verdicts(lambda: episodes.unjudged_in_windows(session=session,
                                                                windows=served),
                           wait_s=self._verdict_wait_s)
            pairs = episodes.shadow_pairs(
                session=session, candidate_id=request.candidate_checkpoint_id,
                production_id=request.production_checkpoint_id,
                since=parse_time(request.since),
            )
            samples = [
                ShadowSample(episode_id=e, steps_compared=c, steps_agreed=a,
                             production_reward=p, candidate_reward=r)
                for e, c, a, p, r, _ in pairs
            ]
            clean = [s for s, pair in zip(samples, pairs, strict=True) if pair[5] is None]
            faults: list[dict[str, Any]] = []
            for pair in pairs:
                if pair[5] is not None and pair[5] not in faults:
                    faults.append(pair[5])
            everything = decide_shadow(samples, spec)
            decision = without_fault_passes(
                all_episodes=everything,
                clean_episodes=decide_shadow(clean, spec) if faults else everything,
                faults=faults, faulted_episodes=len(samples) - len(clean),
            )
            production_terms, shadow_terms = episodes.shadow_pair_terms(
                session=session, candidate_id=request.candidate_checkpoint_id,
                production_id=request.production_checkpoint_id, since=since)
            decision.evidence["attribution"] = _recorded_attribution(
                session, spec, shadow_terms, production_terms)
            return self._store_window_gate(
                session, request.promotion_id, decision, threshold_id=request.threshold_id,
                windows=windows)

    @activity.defn(name=LOOK_CANARY.name)
    def look_canary(self, request: CanaryLook) -> GateOutcome:
        """One sequential-test look at canary vs production since the canary started."""
        self.own(request.promotion_id, "look_canary")
        since = parse_time(request.since)
        with session_scope(self._engine) as session:
            spec = _spec(session, request.threshold_id)

            def decide(clean: bool) -> GateDecision:
                canary = episodes.episode_counts(
                    session=session, checkpoint_id=request.candidate_checkpoint_id,
                    purposes=CANARY_PURPOSES, since=since, clean=clean,
                )
                production = episodes.episode_counts(
                    session=session, checkpoint_id=request.production_checkpoint_id,
                    purposes=(Purpose.PRODUCTION,), since=since, clean=clean,
                )
                canary_reward = episodes.reward_summary(
                    session=session, checkpoint_id=request.candidate_checkpoint_id,
                    purposes=CANARY_PURPOSES, since=since, clean=clean,
                )
                production_reward = episodes.reward_summary(
                    session=session, checkpoint_id=request.production_checkpoint_id,
                    purposes=(Purpose.PRODUCTION,), since=since, clean=clean,
                )
                return decide_canary(CanaryObservation(
                    canary=BinomialCounts(*canary), production=BinomialCounts(*production),
                    soak_complete=request.soak_complete,
                    canary_reward=RewardSummary(*canary_reward),
                    production_reward=RewardSummary(*production_reward),
                    look=request.look,
                ), spec)

            canary_windows: list[episodes.Window] = [
                (request.candidate_checkpoint_id, CANARY_PURPOSES, since, None),
                (request.production_checkpoint_id, (Purpose.PRODUCTION,), since, None),
            ]

            def attribution() -> dict[str, Any]:
                return _recorded_attribution(
                    session, spec,
                    episodes.window_terms(session=session,
                                          checkpoint_id=request.candidate_checkpoint_id,
                                          purposes=CANARY_PURPOSES, since=since),
                    episodes.window_terms(session=session,
                                          checkpoint_id=request.production_checkpoint_id,
                                          purposes=(Purpose.PRODUCTION,), since=since))

            return self._judge_windows(session, request.promotion_id, decide,
                                       threshold_id=request.threshold_id,
                                       windows=canary_windows, attribution=attribution)

    @activity.defn(name=LOOK_WATCH.name)
    def look_watch(self, request: WatchLook) -> GateOutcome:
        """One look at production since promotion against both pre-promotion baselines."""
        self.own(request.promotion_id, "look_watch")
        promoted_at = parse_time(request.promoted_at)
        with session_scope(self._engine) as session:
            spec = _spec(session, request.threshold_id)
            deployment = store.get_deployment(session=session, alias=Purpose.PRODUCTION)
            if deployment is None or deployment.checkpoint_id != request.candidate_checkpoint_id:
                now_serving = deployment.checkpoint_id if deployment is not None else None
                decision = GateDecision(
                    gate=Gate.WATCH, passed=False, verdict=Verdict.FAIL, evidence={},
                    reasons=[f"production no longer serves the candidate (now {now_serving}): "
                             "it was rolled back or replaced during the watch"],
                )
                return self._store(session, request.promotion_id, decision,
                                   threshold_id=request.threshold_id)
            before = parse_time(request.baseline_since)
            windows = {
                "previous production": (request.baseline_checkpoint_id, (Purpose.PRODUCTION,)),
                "candidate during canary": (request.candidate_checkpoint_id, (Purpose.CANARY,)),
            }
            candidate = request.candidate_checkpoint_id

            def decide(clean: bool) -> GateDecision:
                counts = {
                    name: BinomialCounts(*episodes.episode_counts(
                        session=session, checkpoint_id=checkpoint, purposes=purposes,
                        since=before, until=promoted_at, clean=clean))
                    for name, (checkpoint, purposes) in windows.items()
                }
                rewards = {
                    name: RewardSummary(*episodes.reward_summary(
                        session=session, checkpoint_id=checkpoint, purposes=purposes,
                        since=before, until=promoted_at, clean=clean))
                    for name, (checkpoint, purposes) in windows.items()
                }
                promoted_counts = episodes.episode_counts(
                    session=session, checkpoint_id=candidate, purposes=(Purpose.PRODUCTION,),
                    since=promoted_at, clean=clean)
                promoted_reward = episodes.reward_summary(
                    session=session, checkpoint_id=candidate, purposes=(Purpose.PRODUCTION,),
                    since=promoted_at, clean=clean)
                return decide_watch_against_baselines(
                    counts,
                    BinomialCounts(*promoted_counts),
                    period_complete=request.period_complete,
                    thresholds=spec,
                    rewards=rewards,
                    promoted_reward=RewardSummary(*promoted_reward),
                    look=request.look,
                )

            watch_windows: list[episodes.Window] = [
                *((checkpoint, purposes, before, promoted_at)
                  for checkpoint, purposes in windows.values()),
                (candidate, (Purpose.PRODUCTION,), promoted_at, None),
            ]
            return self._judge_windows(session, request.promotion_id, decide,
                                       threshold_id=request.threshold_id,
                                       windows=watch_windows)
