"""PromotionWorkflow: stability, offline eval, shadow, canary, audit, approval, promote, watch.

Offline eval plays the candidate and production on the threshold's eval sets, and, when
the threshold requires the placebo control, the placebo run's last checkpoint as a third
arm, recorded and requested exactly like the other two.

The stability gate is judged when the promotion opens (``open_promotion`` reads the run's
recorded alarms): a candidate whose run raised an echo-trap or template-collapse alarm
within the threshold's window waits for an operator's ``override_alarms`` decision, and
is rejected when none comes before the approval deadline.

Gate verdicts are computed and stored by activities, so a history replays the
verdict it recorded even after the gate rules change. Human decisions arrive as
updates that carry only the id of the decision the web service recorded; the
validator refuses a decision the promotion is not waiting for, and the handler's
activity reads the person and their roles from the database, re-checks separation
of duties with the pure rules in ``governance_loop.gates.human`` and asks OPA again
before anything is written. Soaks are durable timers and every polling loop
sleeps between looks, so a soak of days adds a few hundred events to the history.

A cancelled promotion, or one whose activity failed for good, frees its routing slots and
records how it ended (``close_promotion``) before it ends. A reset run of a promotion is
refused by the first activity it reaches (the promotion belongs to the run that opened it),
and a terminated one's claims lapse by themselves; governance's interruption watch audits
both (``governance_loop.interruptions``).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    FailureError,
    NexusOperationError,
)

with workflow.unsafe.imports_passed_through():
    import governance_loop.contracts as m
    from governance_loop.gates import HumanDecisionError, Verdict, refuse_out_of_turn
    from governance_loop.workflows._shared import (
        execution_loop,
        failure_chain,
        refusal,
    )
    from triloop import search_attributes
    from triloop.activity_contract import ActivityContract
    from triloop.nexus_api import ExecutionService
    from triloop.statuses import Gate, Purpose
    from triloop.statuses import PromotionStatus as Outcome
    from triloop.workflow_api import (
        PROMOTION_APPROVE_UPDATE,
        PROMOTION_OVERRIDE_ALARMS_UPDATE,
        PROMOTION_PROPOSED_SIGNAL,
        PROMOTION_SIGN_AUDIT_UPDATE,
        PROMOTION_STATUS_QUERY,
        PROMOTION_WORKFLOW,
        DecisionRef,
        ErrorType,
        GateSummary,
        PromotionInput,
        PromotionStatus,
        RollbackInput,
        RolloutBatchInput,
    )

# Marks histories recorded before a promotion ended with its TriloopOutcome search attribute.
OUTCOME_PATCH = "promotion-outcome-search-attribute"
# Marks histories recorded before a cancelled or failed promotion freed its routing slots.
CLOSE_PATCH = "promotion-close-on-cancel-or-failure"
# Marks histories whose eval batches governance records itself (``rollout_batch``) before
# asking execution; histories recorded before it asked execution to record them.
RECORDED_BATCHES_PATCH = "governance-records-its-eval-batches"
# Marks histories whose offline eval plays a third arm, the placebo run's last checkpoint,
# when the threshold requires the placebo control (issue 27).
PLACEBO_PATCH = "offline-eval-plays-the-placebo"


@workflow.defn(name=PROMOTION_WORKFLOW)
class PromotionWorkflow:
    """stability -> offline eval -> shadow -> canary -> audit -> approval -> promote -> watch."""

    def __init__(self) -> None:
        self._proposal_id = ""
        self._plan: m.PromotionPlan | None = None
        self._status = Outcome.open
        self._gate: Gate | None = None
        self._waiting_for: str | None = None
        self._reason: str | None = None
        self._results: list[GateSummary] = []
        self._audit: m.GateOutcome | None = None
        self._approval: m.GateOutcome | None = None
        self._override: m.GateOutcome | None = None
        self._alarm_block: list[str] = []  # why the alarms block, while they do
        self._auditor: str | None = None
        self._approver: str | None = None
        self._deciding = False
        self._proposals_seen = 0

    @workflow.signal(name=PROMOTION_PROPOSED_SIGNAL)
    def proposed(self, proposal: PromotionInput | None = None) -> None:
        """The learning loop's signal-with-start; a repeated proposal changes nothing."""
        del proposal
        self._proposals_seen += 1

    @workflow.query(name=PROMOTION_STATUS_QUERY)
    def status(self) -> PromotionStatus:
        """The current gate, each final result, and who decided."""
        return PromotionStatus(
            proposal_id=self._proposal_id,
            promotion_id=self._plan.promotion_id if self._plan else None,
            status=self._status, current_gate=self._gate, results=list(self._results),
            waiting_for=self._waiting_for, audited_by=self._auditor,
            approved_by=self._approver, reason=self._reason,
        )

    @workflow.run
    async def run(self, request: PromotionInput) -> PromotionStatus:
        """Walk the gates; stop at the first that does not pass."""
        self._proposal_id = request.proposal_id
        try:
            plan: m.PromotionPlan = await m.OPEN_PROMOTION.call(m.OpenPromotionInput(
                proposal_id=request.proposal_id, checkpoint_id=request.checkpoint_id,
                run_id=request.run_id, submitted_by=request.submitted_by,
                workflow_id=workflow.info().workflow_id,
                stability_alarms=list(request.stability_alarms),
            ))
        except ActivityError as error:
            cause = error.cause
            if isinstance(cause, ApplicationError) and cause.type == ErrorType.PROMOTION_ENDED:
                # Started again after it ended: its row says so, and nothing runs twice.
                self._status, self._reason = Outcome.refused, cause.message
                raise ApplicationError(f"refused: {cause.message}", type=ErrorType.PROMOTION_ENDED,
                                       non_retryable=True) from error
            raise
        self._plan = plan
        try:
            await self._walk(plan)
        except (asyncio.CancelledError, FailureError) as error:
            # Cancelled, or an activity failed for good: leave no routing behind. (A
            # terminated run runs nothing; its claims lapse by themselves, and governance's
            # interruption watch records it: ``governance_loop.interruptions``.)
            if workflow.patched(CLOSE_PATCH):
                await self._close(plan, error)
            raise
        await workflow.wait_condition(workflow.all_handlers_finished)
        # Temporal shows every promotion that returns as COMPLETED; the outcome (promoted,
        # rolled_back, rejected, ...) is a search attribute too, so a list can filter on it.
        if workflow.patched(OUTCOME_PATCH):
            workflow.upsert_search_attributes(
                [search_attributes.OUTCOME.value_set(self._status)])
        return self.status()

    async def _walk(self, plan: m.PromotionPlan) -> None:
        # A plan recorded before the stability gate existed has no verdict: replays skip it.
        if plan.stability_verdict is not None and not await self._stability(plan):
            return
        await self._enter(Gate.OFFLINE_EVAL, "offline eval")
        if plan.problem is not None:
            await self._end(Outcome.rejected, await self._record(Gate.OFFLINE_EVAL, [plan.problem]))
            return
        offline = await self._offline_eval(plan)
        if not offline.passed:
            await self._end(Outcome.rejected, offline)
            return
        for gate in (self._shadow, self._canary):
            outcome = await gate(plan)
            if not outcome.passed:
                regressed = outcome.verdict == Verdict.ABORT_REGRESSION
                status = Outcome.aborted if regressed else Outcome.rejected
                await self._end(status, outcome)
                return
        for human_gate, deadline_s in ((Gate.AUDIT, plan.timing.audit_deadline_s),
                                       (Gate.APPROVAL, plan.timing.approval_deadline_s)):
            outcome_or_none = await self._await_human(human_gate, deadline_s)
            if outcome_or_none is None:
                await self._end(Outcome.expired, await self._record(
                    human_gate, [f"no {human_gate} decision within {deadline_s:g}s"]))
                return
            if not outcome_or_none.passed:
                await self._end(Outcome.rejected, outcome_or_none)
                return
        promoted_at = await self._promote(plan)
        if promoted_at is not None:
            await self._watch(plan, promoted_at)

    async def _close(self, plan: m.PromotionPlan, error: BaseException) -> None:
        cancelled = isinstance(error, asyncio.CancelledError)
        self._status = Outcome.cancelled if cancelled else Outcome.failed
        self._waiting_for = None
        self._reason = "cancelled" if cancelled else failure_chain(error)
        # Scheduled after the cancellation was delivered, so it is not cancelled with it.
        await m.CLOSE_PROMOTION.call(m.ClosePromotion(
            promotion_id=plan.promotion_id, status=self._status, reason=self._reason[:2000]))

    # --- bookkeeping ---------------------------------------------------------------------

    async def _enter(self, gate: Gate, waiting_for: str | None) -> None:
        self._gate, self._waiting_for = gate, waiting_for
        assert self._plan is not None
        await m.MARK_PROMOTION.call(m.MarkPromotion(promotion_id=self._plan.promotion_id,
                                                     gate=gate))

    def _note(self, outcome: m.GateOutcome) -> m.GateOutcome:
        self._results.append(GateSummary(
            gate=outcome.gate, passed=outcome.passed, verdict=outcome.verdict,
            reasons=list(outcome.reasons), gate_result_id=outcome.gate_result_id,
        ))
        return outcome

    async def _record(self, gate: Gate, reasons: list[str]) -> m.GateOutcome:
        assert self._plan is not None
        outcome: m.GateOutcome = await m.RECORD_GATE.call(m.GateRecord(
            promotion_id=self._plan.promotion_id, gate=gate, reasons=reasons,
            threshold_id=self._plan.threshold_id,
        ))
        return self._note(outcome)

    async def _end(self, status: Outcome, outcome: m.GateOutcome | None, reason: str = "") -> None:
        assert self._plan is not None
        self._status, self._waiting_for = status, None
        self._reason = reason or (f"{outcome.gate}: " + "; ".join(outcome.reasons)
                                  if outcome else status)
        await m.MARK_PROMOTION.call(m.MarkPromotion(
            promotion_id=self._plan.promotion_id, status=status, reason=self._reason[:2000]))

    async def _judge(self, gate: ActivityContract[Any, m.GateOutcome], arg: Any
                     ) -> m.GateOutcome:
        outcome = await gate.call(arg)
        return self._note(outcome) if outcome.verdict != Verdict.CONTINUE else outcome

    # --- stability ---------------------------------------------------------------------------

    async def _stability(self, plan: m.PromotionPlan) -> bool:
        """True when the candidate may go on: no recent alarm, or an operator overrode them."""
        reasons = list(plan.stability_reasons)
        if plan.stability_verdict != Verdict.CONTINUE:
            outcome = self._note(m.GateOutcome(
                gate=Gate.STABILITY, passed=plan.stability_verdict == Verdict.PASS,
                verdict=plan.stability_verdict or Verdict.FAIL, reasons=reasons,
                gate_result_id=plan.stability_gate_result_id))
            if not outcome.passed:
                await self._enter(Gate.STABILITY, None)
                await self._end(Outcome.rejected, outcome)
            return outcome.passed
        self._alarm_block = reasons
        self._gate, self._waiting_for = Gate.STABILITY, "operator (override of stability alarms)"
        self._reason = "stability: " + "; ".join(reasons)
        await m.MARK_PROMOTION.call(m.MarkPromotion(
            promotion_id=plan.promotion_id, gate=Gate.STABILITY, reason=self._reason[:2000]))
        deadline_s = plan.timing.approval_deadline_s
        try:
            await workflow.wait_condition(lambda: self._override is not None,
                                          timeout=timedelta(seconds=deadline_s))
        except TimeoutError:
            await workflow.wait_condition(lambda: not self._deciding)
        self._alarm_block = []
        if self._override is None:
            await self._end(Outcome.rejected, await self._record(Gate.STABILITY, [
                *reasons, f"no operator overrode the alarms within {deadline_s:g}s"]))
            return False
        self._reason = None
        await m.MARK_PROMOTION.call(m.MarkPromotion(
            promotion_id=plan.promotion_id,
            reason=f"stability alarms overridden by {self._override.decided_by}"))
        return True

    # --- offline eval ----------------------------------------------------------------------

    async def _offline_eval(self, plan: m.PromotionPlan) -> m.GateOutcome:
        assert plan.threshold_id and plan.eval_set_id and plan.baseline_checkpoint_id
        # An unpredictable nonce (recorded in history, so replay-safe): nobody can request
        # a batch under this id before governance does.
        prefix = f"{workflow.info().workflow_id}-eval-{workflow.uuid4().hex[:12]}"
        arms = {"candidate": plan.candidate_checkpoint_id,
                "production": plan.baseline_checkpoint_id}
        batches = [RolloutBatchInput(batch_id=f"{prefix}-{arm}", purpose=Purpose.EVAL,
                                     items=plan.eval_items, checkpoint_id=checkpoint,
                                     deadline_s=plan.timing.eval_timeout_s / 2)
                   for arm, checkpoint in arms.items()]
        placebo = self._placebo_batch(plan, prefix)
        if placebo is not None:
            arms["placebo"] = placebo.checkpoint_id or ""
            batches.append(placebo)
        if workflow.patched(RECORDED_BATCHES_PATCH):
            # Governance's own rows, planned episodes and all: execution's handler only
            # checks them, so it cannot say governance asked for anything else.
            for batch in batches:
                await m.RECORD_ROLLOUT_BATCH.call(batch)
        execution = execution_loop()
        runs = [
            execution.execute_operation(
                ExecutionService.run_rollouts, batch,
                schedule_to_close_timeout=timedelta(seconds=plan.timing.eval_timeout_s),
            )
            for batch in batches
        ]
        results = await asyncio.gather(*runs, return_exceptions=True)
        errors = [f"{arm} batch: {failure_chain(r)}" for arm, r in zip(arms, results, strict=True)
                  if isinstance(r, BaseException)]
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, NexusOperationError):
                raise result
        return await self._judge(m.DECIDE_OFFLINE_EVAL, m.OfflineEvalInput(
            promotion_id=plan.promotion_id, threshold_id=plan.threshold_id,
            eval_set_id=plan.eval_set_id, candidate_batch_id=f"{prefix}-candidate",
            production_batch_id=f"{prefix}-production", batch_errors=errors,
            eval_set_ids=list(plan.eval_set_ids), placebo_run_id=plan.placebo_run_id,
            placebo_checkpoint_id=plan.placebo_checkpoint_id,
            placebo_batch_id=placebo.batch_id if placebo is not None else None,
        ))

    @staticmethod
    def _placebo_batch(plan: m.PromotionPlan, prefix: str) -> RolloutBatchInput | None:
        """The placebo's eval batch, the same items as the other arms', when the threshold
        requires it and a placebo run was found (a plan recorded before the placebo control
        has neither, so its replay asks for no patch)."""
        if not (plan.placebo_required and plan.placebo_checkpoint_id):
            return None
        if not workflow.patched(PLACEBO_PATCH):
            return None
        return RolloutBatchInput(batch_id=f"{prefix}-placebo", purpose=Purpose.EVAL,
                                 items=plan.eval_items, checkpoint_id=plan.placebo_checkpoint_id,
                                 deadline_s=plan.timing.eval_timeout_s / 2)

    # --- shadow and canary -------------------------------------------------------------------

    async def _claim(self, plan: m.PromotionPlan, slot: Purpose, share: float) -> str:
        """Route the slot to the candidate once no other open promotion holds it."""
        while True:
            change: m.RoutingChange = await m.SET_ROUTING.call(m.RoutingRequest(
                promotion_id=plan.promotion_id, slot=slot,
                checkpoint_id=plan.candidate_checkpoint_id, share=share,
            ))
            if change.ok:
                return change.at
            self._waiting_for = f"the {slot} slot (held by promotion {change.holder})"
            await workflow.sleep(plan.timing.slot_wait_interval_s)

    async def _release(self, plan: m.PromotionPlan, slot: Purpose) -> None:
        await m.SET_ROUTING.call(m.RoutingRequest(
            promotion_id=plan.promotion_id, slot=slot, checkpoint_id=None))

    async def _shadow(self, plan: m.PromotionPlan) -> m.GateOutcome:
        assert plan.threshold_id and plan.baseline_checkpoint_id
        await self._enter(Gate.SHADOW, "shadow slot")
        since = await self._claim(plan, Purpose.SHADOW, 1.0)
        self._waiting_for = "shadow soak"
        await workflow.sleep(plan.timing.shadow_soak_s)
        outcome = await self._judge(m.DECIDE_SHADOW, m.ShadowInput(
            promotion_id=plan.promotion_id, threshold_id=plan.threshold_id,
            candidate_checkpoint_id=plan.candidate_checkpoint_id,
            production_checkpoint_id=plan.baseline_checkpoint_id, since=since,
        ))
        await self._release(plan, Purpose.SHADOW)
        return outcome

    async def _canary(self, plan: m.PromotionPlan) -> m.GateOutcome:
        assert plan.threshold_id and plan.baseline_checkpoint_id
        timing = plan.timing
        await self._enter(Gate.CANARY, "canary slot")
        since = await self._claim(plan, Purpose.CANARY, timing.canary_share)
        self._waiting_for = "canary soak"
        ends = workflow.now() + timedelta(seconds=timing.canary_soak_s)
        look = 0
        while True:
            look += 1
            left = (ends - workflow.now()).total_seconds()
            if left > 0:
                await workflow.sleep(min(timing.canary_check_interval_s, left))
            outcome = await self._judge(m.LOOK_CANARY, m.CanaryLook(
                promotion_id=plan.promotion_id, threshold_id=plan.threshold_id,
                candidate_checkpoint_id=plan.candidate_checkpoint_id,
                production_checkpoint_id=plan.baseline_checkpoint_id, since=since,
                soak_complete=workflow.now() >= ends, look=look,
            ))
            if outcome.verdict != Verdict.CONTINUE:
                break
        # Pass or fail, the canary share goes back to production before anything else.
        await self._release(plan, Purpose.CANARY)
        return outcome

    # --- audit and approval ------------------------------------------------------------------

    async def _await_human(self, gate: Gate, deadline_s: float) -> m.GateOutcome | None:
        await self._enter(gate, "auditor" if gate == Gate.AUDIT else "operator")

        def decided() -> bool:
            return (self._audit if gate == Gate.AUDIT else self._approval) is not None

        try:
            await workflow.wait_condition(decided, timeout=timedelta(seconds=deadline_s))
        except TimeoutError:
            # A decision already being written when the deadline fires still counts.
            await workflow.wait_condition(lambda: not self._deciding)
        return self._audit if gate == Gate.AUDIT else self._approval

    def _check_awaiting(self, gate: Gate, decision: DecisionRef) -> None:
        """Refuse, before anything runs, a decision the promotion is not waiting for now.

        Only the turn is checked here; who decided and whether they may is the activity's
        (``decide_human``), once, on the decision it loads.
        """
        if self._plan is None:
            raise HumanDecisionError("the promotion is still opening; try again shortly")
        if self._deciding:
            raise HumanDecisionError("another decision on this promotion is being recorded")
        if self._status != Outcome.open:
            raise HumanDecisionError(f"the promotion is {self._status}; no {gate} decision")
        refuse_out_of_turn(gate, self._gate)
        if not decision.decision_id:
            raise HumanDecisionError(
                f"a {gate} decision is the id of the decision the web service recorded")

    @workflow.update(name=PROMOTION_SIGN_AUDIT_UPDATE)
    async def sign_audit(self, decision: DecisionRef) -> GateSummary:
        """An auditor signs or rejects; the activity proves the person and asks OPA again."""
        return await self._decide(Gate.AUDIT, decision)

    @sign_audit.validator
    def _validate_audit(self, decision: DecisionRef) -> None:
        self._check_awaiting(Gate.AUDIT, decision)

    @workflow.update(name=PROMOTION_APPROVE_UPDATE)
    async def operator_decision(self, decision: DecisionRef) -> GateSummary:
        """An operator approves or rejects; not the submitter, not the auditor who signed."""
        return await self._decide(Gate.APPROVAL, decision)

    @operator_decision.validator
    def _validate_approval(self, decision: DecisionRef) -> None:
        self._check_awaiting(Gate.APPROVAL, decision)

    @workflow.update(name=PROMOTION_OVERRIDE_ALARMS_UPDATE)
    async def override_alarms(self, decision: DecisionRef) -> GateSummary:
        """An operator (not the submitter) lets the candidate past its run's alarms."""
        return await self._decide(Gate.STABILITY, decision)

    @override_alarms.validator
    def _validate_override(self, decision: DecisionRef) -> None:
        self._check_awaiting(Gate.STABILITY, decision)
        if not self._alarm_block:
            raise HumanDecisionError("no stability alarm blocks this candidate now")

    async def _decide(self, gate: Gate, decision: DecisionRef) -> GateSummary:
        assert self._plan is not None
        self._deciding = True
        try:
            outcome: m.GateOutcome = await m.RECORD_HUMAN_DECISION.call(m.HumanDecisionRecord(
                promotion_id=self._plan.promotion_id, gate=gate,
                decision_id=decision.decision_id, submitted_by=self._plan.submitted_by,
                audited_by=self._auditor,
            ))
        except ActivityError as error:
            raise refusal(error) from error
        finally:
            self._deciding = False
        self._note(outcome)
        if gate == Gate.STABILITY:
            self._override = outcome
        elif gate == Gate.AUDIT:
            self._audit = outcome
            self._auditor = outcome.decided_by if outcome.passed else None
        else:
            self._approval = outcome
            self._approver = outcome.decided_by if outcome.passed else None
        return self._results[-1]

    # --- promote and watch --------------------------------------------------------------------

    async def _promote(self, plan: m.PromotionPlan) -> str | None:
        assert plan.baseline_checkpoint_id and self._auditor and self._approver
        await self._enter(Gate.PROMOTE, None)
        result: m.PromoteResult = await m.PROMOTE_CANDIDATE.call(m.PromoteInput(
            promotion_id=plan.promotion_id, candidate_checkpoint_id=plan.candidate_checkpoint_id,
            baseline_checkpoint_id=plan.baseline_checkpoint_id,
            submitted_by=plan.submitted_by, audited_by=self._auditor,
            approved_by=self._approver,
        ))
        self._note(result.outcome)
        if result.outcome.passed:
            self._status = Outcome.promoted
            return result.promoted_at
        if result.promoted_at is not None:  # moved, but the end state is wrong: undo it
            await self._rollback(plan, "end state after promotion is wrong: "
                                 + "; ".join(result.outcome.reasons))
        await self._end(Outcome.aborted, result.outcome)
        return None

    async def _rollback(self, plan: m.PromotionPlan, reason: str) -> None:
        await m.ROLLBACK_DEPLOYMENT.call(RollbackInput(
            reason=reason, promotion_id=plan.promotion_id))

    async def _watch(self, plan: m.PromotionPlan, promoted_at: str) -> None:
        assert plan.threshold_id and plan.baseline_checkpoint_id
        timing = plan.timing
        self._gate, self._waiting_for = Gate.WATCH, "watch period"
        ends = workflow.now() + timedelta(seconds=timing.watch_period_s)
        look = 0
        while True:
            look += 1
            left = (ends - workflow.now()).total_seconds()
            if left > 0:
                await workflow.sleep(min(timing.watch_check_interval_s, left))
            outcome = await self._judge(m.LOOK_WATCH, m.WatchLook(
                promotion_id=plan.promotion_id, threshold_id=plan.threshold_id,
                candidate_checkpoint_id=plan.candidate_checkpoint_id,
                baseline_checkpoint_id=plan.baseline_checkpoint_id,
                baseline_since=plan.opened_at, promoted_at=promoted_at,
                period_complete=workflow.now() >= ends, look=look,
            ))
            if outcome.verdict != Verdict.CONTINUE:
                break
        if outcome.rollback:
            await self._rollback(plan, "watch: " + "; ".join(outcome.reasons))
        if not outcome.passed:
            await self._end(Outcome.rolled_back, outcome)
            return
        self._waiting_for = None
        await m.MARK_PROMOTION.call(m.MarkPromotion(
            promotion_id=plan.promotion_id, reason="watch passed: " + "; ".join(outcome.reasons)))
