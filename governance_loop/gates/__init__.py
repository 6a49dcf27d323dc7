"""Promotion gates as pure functions: evidence in, ``GateDecision`` out.

``GATE_ORDER`` fixes the path stability -> offline_eval -> shadow -> canary -> audit ->
approval -> promote -> watch; ``next_gate`` says where a promotion stands.
The statistical rules are stated in each module's docstring.
"""

from governance_loop.gates.canary import CanaryObservation, decide_canary
from governance_loop.gates.decision import (
    APPROVAL,
    AUDIT,
    CANARY,
    GATE_ORDER,
    OFFLINE_EVAL,
    PROMOTE,
    SHADOW,
    STABILITY,
    WATCH,
    GateDecision,
    GateOrderError,
    Verdict,
    failed_gate,
    next_gate,
    results_from_decisions,
)
from governance_loop.gates.faults import describe_fault, without_fault_passes
from governance_loop.gates.human import (
    AUDITOR_ROLE,
    HUMAN_DECISION_SERVICE,
    OPERATOR_ROLE,
    AlarmOverrideKind,
    ApprovalDecisionKind,
    AuditDecisionKind,
    HumanDecision,
    HumanDecisionError,
    decide_alarm_override,
    decide_approval,
    decide_audit,
    validate_approval_decision,
    validate_audit_decision,
)
from governance_loop.gates.offline_eval import EvalSetResult, decide_offline_eval
from governance_loop.gates.sequential import RewardSummary
from governance_loop.gates.shadow import ShadowSample, decide_shadow
from governance_loop.gates.stability import (
    BLOCKING_ALARMS,
    RecordedAlarm,
    StabilityCheck,
    decide_stability,
)
from governance_loop.gates.stats import BinomialCounts, EpisodeStats, Interval
from governance_loop.gates.thresholds import (
    CanarySpec,
    ShadowSpec,
    StabilitySpec,
    ThresholdSpec,
    ThresholdSpecError,
    WatchSpec,
)
from governance_loop.gates.watch import (
    WatchObservation,
    decide_watch,
    decide_watch_against_baselines,
)

__all__ = [
    "APPROVAL",
    "BLOCKING_ALARMS",
    "AUDIT",
    "AUDITOR_ROLE",
    "CANARY",
    "GATE_ORDER",
    "HUMAN_DECISION_SERVICE",
    "OFFLINE_EVAL",
    "OPERATOR_ROLE",
    "PROMOTE",
    "SHADOW",
    "STABILITY",
    "WATCH",
    "AlarmOverrideKind",
    "ApprovalDecisionKind",
    "AuditDecisionKind",
    "BinomialCounts",
    "CanaryObservation",
    "CanarySpec",
    "EpisodeStats",
    "EvalSetResult",
    "GateDecision",
    "GateOrderError",
    "HumanDecision",
    "HumanDecisionError",
    "Interval",
    "ShadowSample",
    "RecordedAlarm",
    "ShadowSpec",
    "StabilityCheck",
    "StabilitySpec",
    "ThresholdSpec",
    "ThresholdSpecError",
    "Verdict",
    "RewardSummary",
    "WatchObservation",
    "WatchSpec",
    "decide_alarm_override",
    "decide_approval",
    "decide_audit",
    "decide_canary",
    "decide_offline_eval",
    "decide_shadow",
    "decide_stability",
    "decide_watch",
    "decide_watch_against_baselines",
    "describe_fault",
    "failed_gate",
    "next_gate",
    "results_from_decisions",
    "validate_approval_decision",
    "validate_audit_decision",
    "without_fault_passes",
]
