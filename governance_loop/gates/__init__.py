"""Promotion gates as pure functions: evidence in, ``GateDecision`` out.

The gates are the kernel's ``triloop.statuses.Gate``; ``GATE_ORDER`` fixes the path
stability -> offline_eval -> shadow -> canary -> audit -> approval -> promote -> watch;
``next_gate`` says where a promotion stands.
The statistical rules are stated in each module's docstring.
"""

from governance_loop.gates.attribution import Attribution, attribute, term_kind
from governance_loop.gates.behaviour_audit import (
    AuditEpisodes,
    BehaviourAudit,
    EpisodeBehaviour,
    audit_behaviour,
)
from governance_loop.gates.canary import CanaryObservation, decide_canary
from governance_loop.gates.decision import (
    GATE_ORDER,
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
    OPERATOR_ROLE,
    HumanDecisionError,
    decide_human,
    refuse_out_of_turn,
)
from governance_loop.gates.offline_eval import EvalSetResult, decide_offline_eval
from governance_loop.gates.placebo import PlaceboArm, PlaceboCheck, check_placebo
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
    AttributionSpec,
    BehaviourAuditSpec,
    CanarySpec,
    PlaceboSpec,
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
from triloop.statuses import deciding_role

__all__ = [
    "AuditEpisodes",
    "BehaviourAudit",
    "BehaviourAuditSpec",
    "EpisodeBehaviour",
    "audit_behaviour",
    "BLOCKING_ALARMS",
    "AUDITOR_ROLE",
    "GATE_ORDER",
    "OPERATOR_ROLE",
    "Attribution",
    "AttributionSpec",
    "BinomialCounts",
    "CanaryObservation",
    "CanarySpec",
    "EpisodeStats",
    "EvalSetResult",
    "GateDecision",
    "GateOrderError",
    "HumanDecisionError",
    "Interval",
    "PlaceboArm",
    "PlaceboCheck",
    "PlaceboSpec",
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
    "check_placebo",
    "attribute",
    "decide_canary",
    "decide_human",
    "deciding_role",
    "decide_offline_eval",
    "decide_shadow",
    "decide_stability",
    "decide_watch",
    "decide_watch_against_baselines",
    "describe_fault",
    "failed_gate",
    "next_gate",
    "refuse_out_of_turn",
    "results_from_decisions",
    "term_kind",
    "without_fault_passes",
]
