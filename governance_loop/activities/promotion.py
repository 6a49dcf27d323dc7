"""Promotion activities that change state: open, mark, routing slots, human decisions, promote."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine
from sqlmodel import Session, select
from temporalio import activity
from temporalio.exceptions import ApplicationError

from governance_loop import store
from governance_loop.activities import stability
from governance_loop.activity_support import (
    GovernanceShell,
    calling_run,
    owner_of,
    record,
    record_refusal,
    refused,
    rfc3339,
    row_id,
    run_refused,
    store_gate,
)
from governance_loop.contracts import (
    CLOSE_PROMOTION,
    MARK_PROMOTION,
    OPEN_PROMOTION,
    PROMOTE_CANDIDATE,
    RECORD_GATE,
    RECORD_HUMAN_DECISION,
    RECORD_ROLLOUT_BATCH,
    SET_ROUTING,
    ClosePromotion,
    GateOutcome,
    GateRecord,
    HumanDecisionRecord,
    MarkPromotion,
    OpenPromotionInput,
    PromoteInput,
    PromoteResult,
    PromotionPlan,
    RoutingChange,
    RoutingRequest,
)
from governance_loop.durations import PromotionTiming
from governance_loop.evalsets import candidate_eval_sets
from governance_loop.gates import (
    GateDecision,
    HumanDecisionError,
    ThresholdSpec,
    Verdict,
    decide_human,
    deciding_role,
)
from governance_loop.gates.promote import (
    PromoteFacts,
    PromoteRefused,
    RunRef,
    StoredGate,
    refuse_foreign_run,
    refuse_promote,
)
from governance_loop.placebo_runs import find_placebo
from triloop.artifacts import ArtifactCorrupted, ArtifactStore
from triloop.db import session_scope
from triloop.decisions import HumanDecision, audit_refusal
from triloop.models import (
    Approval,
    Checkpoint,
    Promotion,
    Proposal,
    Threshold,
    TrainingRun,
)
from triloop.policy import Authorizer, Resource
from triloop.statuses import Decision, Gate, PromotionDecision, Purpose
from triloop.statuses import PromotionStatus as Outcome
from triloop.weights import (
    UnsupportedArtifactUri,
    WeightsIntegrityError,
    checkpoint_dir,
    record_integrity_event,
    verify_weights,
)
from triloop.workflow_api import ErrorType, RolloutBatchInput, RolloutItem

DEFAULT_THRESHOLD_NAME = "promotion"


class _Refusal(Exception):
    """Promote refused under the alias lock: audited after that transaction rolls back."""

    def __init__(self, promotion_id: str, owner: RunRef, caller: RunRef | None,
                 error: PromoteRefused) -> None:
        super().__init__(str(error))
        self.promotion_id, self.owner, self.caller, self.error = (
            promotion_id, owner, caller, error)

class PromotionActivities(GovernanceShell):
    """State changes of a promotion, each authorized, audited and idempotent under retry."""

    def __init__(
        self,
        engine: Engine,
        authorizer: Authorizer,
        *,
        timing: PromotionTiming,
        threshold_name: str = DEFAULT_THRESHOLD_NAME,
        home: Path = Path("."),
        store: ArtifactStore | None = None,
    ) -> None:
        super().__init__(engine, authorizer)
        self._timing = timing
        self._threshold_name = threshold_name
        self._home = home  # relative artifact paths of checkpoints are under it
        self._store = store  # the shared artifact store, for artifact:// checkpoints

    @activity.defn(name=OPEN_PROMOTION.name)
    def open_promotion(self, request: OpenPromotionInput) -> PromotionPlan:
        """Create the promotion row and read what it will be judged against."""
        with session_scope(self._engine) as session:
            proposal = session.get(Proposal, request.proposal_id)
            if proposal is None:
                raise refused(f"proposal {request.proposal_id} does not exist; nothing to promote")
            if (proposal.checkpoint_id, proposal.run_id) != (request.checkpoint_id, request.run_id):
                raise refused(
                    f"proposal {proposal.id} names checkpoint {proposal.checkpoint_id} of run "
                    f"{proposal.run_id}, not {request.checkpoint_id} of {request.run_id}"
                )
            caller = calling_run()
            self._refuse_restart(session, proposal.id, request.workflow_id, caller)
            run = session.get(TrainingRun, proposal.run_id)
            # Separation of duties rests on who submitted the run: the web service wrote
            # that row, the proposer only claims it.
            submitted_by = run.submitted_by if run is not None else proposal.submitted_by
            deployment = store.get_deployment(session=session, alias=Purpose.PRODUCTION)
            baseline = deployment.checkpoint_id if deployment is not None else None
        self.authorize(
            "create",
            Resource("promotion", attrs={"proposal_id": proposal.id, "submitted_by": submitted_by}),
        )
        with session_scope(self._engine) as session:
            promotion = store.open_promotion(
                session=session, proposal_id=proposal.id, checkpoint_id=proposal.checkpoint_id,
                run_id=proposal.run_id, submitted_by=submitted_by,
                baseline_checkpoint_id=baseline, workflow_id=request.workflow_id,
                workflow_run_id=caller.run_id if caller else None,
            )
            plan = PromotionPlan(
                promotion_id=promotion.id, submitted_by=submitted_by,
                candidate_checkpoint_id=proposal.checkpoint_id,
                baseline_checkpoint_id=promotion.baseline_checkpoint_id,
                opened_at=promotion.created_at.isoformat(), timing=self._timing,
            )
            self._plan_evaluation(session, plan)
            self._judge_stability(session, plan, proposal, request)
            record(
                session, action="open_promotion",
                resource={"kind": "promotion", "id": promotion.id},
                payload={"proposal_id": proposal.id, "baseline": plan.baseline_checkpoint_id,
                         "threshold_id": plan.threshold_id, "problem": plan.problem,
                         "stability": plan.stability_verdict,
                         **({"placebo": {"run_id": plan.placebo_run_id,
                                         "checkpoint_id": plan.placebo_checkpoint_id}}
                            if plan.placebo_required else {})},
            )
        return plan

    def _judge_stability(self, session: Session, plan: PromotionPlan, proposal: Proposal,
                         request: OpenPromotionInput) -> None:
        """The stability gate: the run's recorded alarms against the threshold's window.

        A pass or a mismatch is final and stored now; a block waits in the workflow for
        an operator's override (``record_human_decision`` with gate ``stability``).
        """
        if plan.problem is not None or plan.threshold_id is None:
            return  # nothing to judge by; the promotion ends on its problem
        threshold = session.get(Threshold, plan.threshold_id)
        assert threshold is not None
        check = stability.check_proposal(
            session=session, proposal=proposal, carried=request.stability_alarms,
            spec=ThresholdSpec.from_mapping(threshold.spec))
        plan.stability_verdict = check.decision.verdict.value
        plan.stability_reasons = list(check.decision.reasons)
        if check.decision.final:
            self.authorize("create", Resource("gate_result", attrs={
                "promotion_id": plan.promotion_id, "gate": Gate.STABILITY}))
            plan.stability_gate_result_id = store_gate(
                session, promotion_id=plan.promotion_id, decision=check.decision,
                threshold_id=plan.threshold_id).gate_result_id

    def _refuse_restart(self, session: Session, proposal_id: str, workflow_id: str,
                        caller: RunRef | None) -> None:
        """A proposal's promotion runs once: its row must be open and belong to this run.

        The learning loop starts promotions with ``REJECT_DUPLICATE``, but a start is
        only as strict as its caller asks; this check holds whoever starts the workflow,
        and a reset to before the promotion opened (a new run of the same workflow).
        """
        query = select(Promotion).where(Promotion.proposal_id == proposal_id)
        existing = session.exec(query).first()
        if existing is None:
            return
        problem = None
        if existing.status != Outcome.open:  # promoted, rejected, aborted, rolled_back, expired
            problem = (
                f"promotion {existing.id} of proposal {proposal_id} already ended "
                f"{existing.status}; an ended promotion is never run again (a rolled-back or "
                "rejected candidate needs a new proposal and a new promotion)"
            )
        elif existing.workflow_id not in (None, workflow_id):
            problem = (
                f"promotion {existing.id} of proposal {proposal_id} belongs to workflow "
                f"{existing.workflow_id}, not {workflow_id}"
            )
        elif caller is not None and existing.workflow_run_id not in (None, caller.run_id):
            problem = (
                f"promotion {existing.id} of proposal {proposal_id} belongs to run "
                f"{existing.workflow_run_id} of {workflow_id}, not run {caller.run_id} (a "
                "reset or a restart); only the run that opened a promotion runs it"
            )
        if problem is None:
            return
        with session_scope(self._engine) as audit:  # recorded even though this call fails
            record(audit, action="refuse_promotion_restart",
                   resource={"kind": "promotion", "id": existing.id},
                   payload={"proposal_id": proposal_id, "workflow_id": workflow_id,
                            "run_id": caller.run_id if caller else None,
                            "status": existing.status, "reason": problem})
        raise ApplicationError(problem, type=ErrorType.PROMOTION_ENDED, non_retryable=True)

    def _plan_evaluation(self, session: Session, plan: PromotionPlan) -> None:
        """Fill in the threshold, the frozen eval set and its items, or the problem."""
        if plan.baseline_checkpoint_id is None:
            plan.problem = "no production deployment to compare with: bootstrap production first"
            return
        if plan.baseline_checkpoint_id == plan.candidate_checkpoint_id:
            plan.problem = "the candidate already serves production"
            return
        threshold = store.latest_threshold(session=session, name=self._threshold_name)
        if threshold is None or (threshold.eval_set_id is None and not threshold.eval_sets):
            plan.problem = (
                f"no threshold {self._threshold_name!r} naming an eval set: "
                "set one with `triloop governance threshold set`"
            )
            return
        # The eval sets of what the candidate was trained on (its run's tasks' environments).
        promotion = store.get_promotion(session=session, promotion_id=plan.promotion_id)
        chosen = candidate_eval_sets(session=session, threshold=threshold,
                                     run_id=promotion.run_id)
        plan.threshold_id = threshold.id
        if chosen.problem is not None:
            plan.problem = chosen.problem
            return
        plan.eval_set_ids = chosen.eval_set_ids
        plan.eval_set_id = chosen.eval_set_ids[0]
        spec = ThresholdSpec.from_mapping(threshold.spec)
        items: dict[str, RolloutItem] = {}
        for eval_set_id in chosen.eval_set_ids:
            tasks = store.eval_set_tasks(session=session, eval_set_id=eval_set_id)
            if not tasks:
                plan.problem = f"eval set {eval_set_id} has no items"
                return
            # Each set gets its min_samples; a task two sets share plays for the larger.
            per_task = max(1, math.ceil(spec.min_samples / len(tasks)))
            for task_id, seed, _ in tasks:
                known = items.get(task_id)
                if known is None or known.group_size < per_task:
                    items[task_id] = RolloutItem(task_id=task_id, seed=seed, group_size=per_task)
        plan.eval_items = list(items.values())
        if spec.placebo.required_for(Purpose.PRODUCTION):
            # Found now, so the eval batches the workflow records name its checkpoint.
            plan.placebo_required = True
            found = find_placebo(session=session, run_id=promotion.run_id)
            if found is not None:
                plan.placebo_run_id, plan.placebo_checkpoint_id = found.run_id, found.checkpoint_id

    @activity.defn(name=MARK_PROMOTION.name)
    def mark_promotion(self, mark: MarkPromotion) -> None:
        """Record the gate the promotion is at, or how it ended."""
        self.authorize("update", Resource("promotion", id=mark.promotion_id,
                                          attrs={"status": mark.status, "gate": mark.gate}))
        self.own(mark.promotion_id, "mark_promotion")
        try:
            with session_scope(self._engine) as session:
                store.update_promotion(
                    session=session, promotion_id=mark.promotion_id, status=mark.status,
                    current_gate=mark.gate, reason=mark.reason,
                )
        except store.StoreError as error:
            raise refused(str(error)) from error

    @activity.defn(name=RECORD_ROLLOUT_BATCH.name)
    def record_rollout_batch(self, batch: RolloutBatchInput) -> None:
        """Record a batch governance is about to ask execution for, with its planned episodes:
        execution's handler only checks this row, and stores nothing outside the plan."""
        self.authorize("create", Resource("rollout_batch", id=batch.batch_id,
                                          attrs={"purpose": batch.purpose}))
        try:
            with session_scope(self._engine) as session:
                store.record_rollout_batch(session=session, batch=batch)
        except store.StoreError as conflict:
            raise refused(str(conflict)) from conflict

    @activity.defn(name=RECORD_GATE.name)
    def record_gate(self, gate: GateRecord) -> GateOutcome:
        """Store a verdict the workflow reached itself (a deadline passed, a precondition)."""
        self.authorize("create", Resource("gate_result", attrs={"gate": gate.gate}))
        self.own(gate.promotion_id, "record_gate")
        decision = GateDecision(
            gate=gate.gate, passed=gate.verdict == Verdict.PASS.value, reasons=gate.reasons,
            evidence=gate.evidence, verdict=Verdict(gate.verdict),
        )
        with session_scope(self._engine) as session:
            return store_gate(
                session, promotion_id=gate.promotion_id, decision=decision,
                threshold_id=gate.threshold_id, eval_set_id=gate.eval_set_id,
            )

    @activity.defn(name=SET_ROUTING.name)
    def set_routing(self, request: RoutingRequest) -> RoutingChange:
        """Claim a shadow/canary slot for a promotion, or release it; never take another's."""
        if request.slot not in (Purpose.SHADOW, Purpose.CANARY):
            raise refused(f"a promotion routes only the shadow and canary slots: {request.slot}")
        self.authorize("route", Resource("routing", id=request.slot, attrs={
            "checkpoint_id": request.checkpoint_id, "share": request.share,
            "promotion_id": request.promotion_id,
        }))
        self.own(request.promotion_id, "route")
        with session_scope(self._engine) as session:
            store.get_routing(session=session, slot=request.slot, for_update=True)
            now = store.db_now(session)
            held = store.routing_table(session=session)[request.slot]  # lapsed claims: empty
            holder = held.promotion_id if held.checkpoint_id else None
            if holder not in (None, request.promotion_id):
                if request.checkpoint_id is None:  # releasing: it is not ours anyway
                    return RoutingChange(ok=True, at=now.isoformat())
                return RoutingChange(ok=False, at=now.isoformat(), holder=holder)
            if request.checkpoint_id is not None:
                self._refuse_claim_for_ended(session, request)
            store.set_routing(
                session=session, slot=request.slot, checkpoint_id=request.checkpoint_id,
                share=request.share if request.checkpoint_id else 0.0,
                promotion_id=request.promotion_id if request.checkpoint_id else None,
                updated_by="governance",
                claim_expires_at=now + timedelta(seconds=self._timing.claim_s(request.slot)),
            )
            record(session, action="route", resource={"kind": "routing", "id": request.slot},
                   payload={"checkpoint_id": request.checkpoint_id, "share": request.share,
                            "promotion_id": request.promotion_id})
            return RoutingChange(ok=True, at=now.isoformat())

    def _refuse_claim_for_ended(self, session: Session, request: RoutingRequest) -> None:
        """An ended promotion claims no slot (its claim would not serve anyway)."""
        promotion = store.get_promotion(session=session, promotion_id=request.promotion_id)
        if promotion.status != Outcome.open:
            raise refused(f"promotion {promotion.id} ended {promotion.status}; it claims no "
                          f"{request.slot} slot; propose the candidate again")

    @activity.defn(name=CLOSE_PROMOTION.name)
    def close_promotion(self, request: ClosePromotion) -> None:
        """A promotion's run ends early (cancelled, failed): free its slots, record how.

        Any run may free the slots a promotion claims (that only serves less); only the run
        that opened it changes its status, and only while it is open.
        """
        self.authorize("update", Resource("promotion", id=request.promotion_id,
                                          attrs={"status": request.status, "gate": None}))
        caller = calling_run()
        with session_scope(self._engine) as session:
            promotion = store.get_promotion(session=session, promotion_id=request.promotion_id,
                                            for_update=True)
            released = store.release_claims(session=session, promotion_id=promotion.id,
                                            updated_by="governance")
            owned = caller is None or caller.run_id in (None, promotion.workflow_run_id)
            ended = owned and promotion.status == Outcome.open
            if ended:
                store.update_promotion(session=session, promotion_id=promotion.id,
                                       status=request.status, reason=request.reason[:2000])
            record(session, action="close_promotion",
                   resource={"kind": "promotion", "id": promotion.id},
                   payload={"status": request.status if ended else promotion.status,
                            "asked": request.status, "reason": request.reason,
                            "released": released,
                            "run_id": caller.run_id if caller else None})

    @activity.defn(name=RECORD_HUMAN_DECISION.name)
    def record_human_decision(self, request: HumanDecisionRecord) -> GateOutcome:
        """Carry out a person's decision at an audit, approval or stability gate.

        One path for the three: prove the decision from the row the web role wrote (the
        person and their roles read from the database), the duty rules once
        (``decide_human``), a role held since before the promotion opened for a decision
        that lets the candidate on, then OPA again acting for the person, then the write.
        Each refusal is audited.
        """
        gate = request.gate
        self.own(request.promotion_id, f"{gate}_decision")
        attrs = {"submitted_by": request.submitted_by}
        if gate is Gate.APPROVAL:
            attrs["audited_by"] = request.audited_by or ""
        resource = Resource("promotion", id=request.promotion_id, attrs=attrs)
        proven = self.prove(request.decision_id, PromotionDecision.kind_at(gate),
                            request.promotion_id, role=deciding_role(gate), resource=resource)
        try:  # the pure duty rules first: their refusals say the most
            verdict = decide_human(proven, gate=gate, submitter=request.submitted_by,
                                   auditor=request.audited_by)
        except HumanDecisionError as exc:
            audit_refusal(self._engine, service="governance",
                          action=proven.choice or f"{proven.kind}_decision",
                          resource=resource.to_input(), decision_id=proven.id, reason=str(exc))
            raise refused(str(exc)) from exc
        choice = proven.choice
        assert choice is not None  # decide_human refused any other decision
        opened_at = self._opened_at(request.promotion_id)
        if choice.passes:
            self._refuse_newer_role(proven, choice, resource, opened_at)
        attrs["promotion_opened_at"] = rfc3339(opened_at)
        if gate is not Gate.STABILITY:  # the policy compares the deciders
            attrs["audited_by" if gate is Gate.AUDIT else "approved_by"] = proven.user
        self.authorize_for(proven, choice, Resource("promotion", id=request.promotion_id,
                                                    attrs=attrs))
        with session_scope(self._engine) as session:
            if gate is Gate.STABILITY:
                verdict = self._overriding(session, verdict, request, proven)
            else:
                self._add_approval(session, request, proven, verdict)
            outcome = store_gate(session, promotion_id=request.promotion_id, decision=verdict)
        return replace(outcome, decided_by=proven.user)

    @staticmethod
    def _add_approval(session: Session, request: HumanDecisionRecord, proven: HumanDecision,
                      verdict: GateDecision) -> None:
        """The audit's or the approval's ``approval`` row (once under retries)."""
        key = row_id("approval")
        if session.get(Approval, key) is None:
            store.add_approval(
                session=session, promotion_id=request.promotion_id,
                kind="audit" if request.gate is Gate.AUDIT else "operator",
                decision=Decision.APPROVE if verdict.passed else Decision.REJECT,
                user_name=proven.user, comment=proven.comment, row_id=key,
            )

    @staticmethod
    def _overriding(session: Session, verdict: GateDecision, request: HumanDecisionRecord,
                    proven: HumanDecision) -> GateDecision:
        """An alarm override's gate result names the alarms it overrode.

        The same proof as an approval (the row the web role wrote, the operator role held now
        and since before the promotion opened, not the run's submitter, OPA acting for the
        person); the override is a passed ``stability`` gate result naming the operator,
        their reason and the alarms they overrode.
        """
        promotion = store.get_promotion(session=session, promotion_id=request.promotion_id)
        alarms = stability.recorded_alarms(session=session, run_id=promotion.run_id)
        return replace(verdict, evidence={
            **verdict.evidence, "overridden": True, "human_decision_id": proven.id,
            "recorded_alarms": [a.to_dict() for a in sorted(alarms)]})

    def _opened_at(self, promotion_id: str) -> datetime:
        """When the promotion opened, read from its row (never from a message)."""
        with Session(self._engine) as session:
            promotion = session.get(Promotion, promotion_id)
        if promotion is None:
            raise refused(f"promotion {promotion_id} does not exist")
        return promotion.created_at

    def _refuse_newer_role(self, proven: HumanDecision, action: PromotionDecision,
                           resource: Resource, opened_at: datetime) -> None:
        """Refuse (audited) a role that became active after the promotion opened.

        Otherwise an admin could grant a role to someone for this very candidate once it is
        on the way; the role must predate what it is used to decide.
        """
        since = proven.role_since
        if since is not None and since <= opened_at:
            return
        held = "an unknown time" if since is None else rfc3339(since)
        reason = (f"{proven.user} may not {action} promotion {resource.id}: their role became"
                  f" active at {held}, after the promotion opened at {rfc3339(opened_at)}; a"
                  " person whose role predates the promotion must decide")
        audit_refusal(self._engine, service="governance", action=action,
                      resource=resource.to_input(), decision_id=proven.id, reason=reason)
        raise refused(reason)

    @activity.defn(name=PROMOTE_CANDIDATE.name)
    def promote_candidate(self, request: PromoteInput) -> PromoteResult:
        """Move production to the candidate in one transaction, then check the end state."""
        self.authorize("promote", Resource("promotion", id=request.promotion_id, attrs={
            "submitted_by": request.submitted_by, "audited_by": request.audited_by,
            "approved_by": request.approved_by,
        }))
        try:
            return self._promote(request)
        except _Refusal as refusal:  # audited once the locks are let go (the audit's own
            self._audit_refusal(refusal)  # rows reference the locked promotion row)
            raise run_refused(refusal.error) from refusal.error

    def _promote(self, request: PromoteInput) -> PromoteResult:
        with session_scope(self._engine) as session:
            current = store.get_deployment(session=session, alias=Purpose.PRODUCTION,
                                           for_update=True)
            already = current is not None and current.promotion_id == request.promotion_id
            self._recheck(session, request, moving=not already)
            if not already and (current is None
                                or current.checkpoint_id != request.baseline_checkpoint_id):
                moved = current.checkpoint_id if current is not None else None
                return PromoteResult(self._promote_gate(session, request, [
                    f"production moved from the baseline {request.baseline_checkpoint_id} to "
                    f"{moved} during the promotion; its evidence is stale, propose again"
                ], passed=False))
            if not already:
                # The weights that move are the ones the gates judged: re-verify them now.
                problem = self._weights_problem(session, request)
                if problem is not None:
                    return PromoteResult(self._promote_gate(session, request, [problem],
                                                            passed=False))
                store.move_alias(
                    session=session, alias=Purpose.PRODUCTION,
                    checkpoint_id=request.candidate_checkpoint_id,
                    rollback_target_id=request.baseline_checkpoint_id,
                    promotion_id=request.promotion_id, actor="governance",
                    reason=f"promotion {request.promotion_id} approved by {request.approved_by}",
                    kind="promote",
                )
                store.set_routing(session=session, slot=Purpose.PRODUCTION,
                                  checkpoint_id=request.candidate_checkpoint_id, share=1.0,
                                  promotion_id=request.promotion_id, updated_by="governance")
                for slot in (Purpose.CANARY, Purpose.SHADOW):
                    store.set_routing(session=session, slot=slot, checkpoint_id=None, share=0.0,
                                      promotion_id=None, updated_by="governance")
                store.update_promotion(session=session, promotion_id=request.promotion_id,
                                       status=Outcome.promoted, current_gate=Gate.WATCH)
            promoted_at = store.db_now(session).isoformat()
        with session_scope(self._engine) as session:
            problems = self._end_state_problems(session, request)
            outcome = self._promote_gate(
                session, request,
                problems or [f"production serves {request.candidate_checkpoint_id}; rollback "
                             f"target is {request.baseline_checkpoint_id}"],
                passed=not problems,
            )
        return PromoteResult(outcome, promoted_at)

    def _recheck(self, session: Session, request: PromoteInput, *, moving: bool) -> None:
        """Under the alias's lock: this run's open promotion passed every gate, and the
        candidate was not rolled back since (``governance_loop.gates.promote``).

        A retry that finds the move done (``moving`` False) re-checks only the run. A
        refusal ends the transaction unmoved and is audited as ``refuse_promote``.
        """
        promotion = store.get_promotion(session=session, promotion_id=request.promotion_id,
                                        for_update=True)
        caller = calling_run()
        facts = PromoteFacts(
            promotion_id=promotion.id, status=promotion.status, owner=owner_of(promotion),
            caller=caller, candidate_checkpoint_id=request.candidate_checkpoint_id,
            gates=[StoredGate(gate=g.gate, passed=g.passed, created_at=g.created_at)
                   for g in store.gate_results(session=session, promotion_id=promotion.id)],
            history=store.deployment_revisions(session=session, alias=Purpose.PRODUCTION),
        )
        try:
            if moving:
                refuse_promote(facts)
            else:
                refuse_foreign_run(promotion.id, owner=facts.owner, caller=caller)
        except PromoteRefused as error:
            # Plain values: the transaction rolls back (and expires its rows) before the audit.
            raise _Refusal(promotion.id, facts.owner, caller, error) from error
        if promotion.checkpoint_id != request.candidate_checkpoint_id:
            raise refused(f"promotion {promotion.id} judged checkpoint {promotion.checkpoint_id}"
                          f", not {request.candidate_checkpoint_id}; nothing else moves")

    def _audit_refusal(self, refusal: _Refusal) -> None:
        if refusal.caller is not None:
            self.refuse_run(refusal.promotion_id, refusal.owner, refusal.caller, "promote",
                            refusal.error)
            return
        with session_scope(self._engine) as audit:
            record_refusal(audit, action="promote", promotion_id=refusal.promotion_id,
                           caller=None, error=refusal.error)

    def _weights_problem(self, session: Session, request: PromoteInput) -> str | None:
        """Why the candidate's weights may not move to production (an integrity event), if so."""
        checkpoint_id = request.candidate_checkpoint_id
        row = session.get(Checkpoint, checkpoint_id)
        if row is None:
            return f"integrity: checkpoint {checkpoint_id} has no row; nothing to verify"
        try:
            verify_weights(checkpoint_dir(row.artifact_uri, home=self._home, store=self._store,
                                          checkpoint_id=checkpoint_id), checkpoint_id)
        except (UnsupportedArtifactUri, ArtifactCorrupted) as error:
            return f"integrity: {error}"
        except WeightsIntegrityError as error:
            record_integrity_event(self._engine, service="governance", error=error,
                                   during="promotion, before production moves",
                                   extra={"promotion_id": request.promotion_id})
            return f"integrity: {error}"
        return None

    def _end_state_problems(self, session: Session, request: PromoteInput) -> list[str]:
        deployment = store.get_deployment(session=session, alias=Purpose.PRODUCTION)
        routes = store.routing_table(session=session)
        problems = []
        if deployment is None or deployment.checkpoint_id != request.candidate_checkpoint_id:
            problems.append("the production alias does not name the candidate after the move")
        if deployment is not None and (
            deployment.rollback_target_id != request.baseline_checkpoint_id
        ):
            problems.append("the rollback target is not the previous production checkpoint")
        production = routes.get(Purpose.PRODUCTION)
        if production is None or production.checkpoint_id != request.candidate_checkpoint_id:
            problems.append("the production routing slot does not name the candidate")
        for slot in (Purpose.CANARY, Purpose.SHADOW):
            if slot in routes and routes[slot].checkpoint_id is not None:
                problems.append(f"the {slot} slot still routes traffic after promotion")
        return problems

    def _promote_gate(
        self, session: Session, request: PromoteInput, reasons: list[str], *, passed: bool
    ) -> GateOutcome:
        decision = GateDecision(
            gate=Gate.PROMOTE, passed=passed, reasons=reasons,
            evidence={"candidate": request.candidate_checkpoint_id,
                      "rollback_target": request.baseline_checkpoint_id,
                      "audited_by": request.audited_by, "approved_by": request.approved_by},
            verdict=Verdict.PASS if passed else Verdict.FAIL,
        )
        return store_gate(session, promotion_id=request.promotion_id, decision=decision)
