"""The words the services share, as enums: statuses, gates, purposes and decisions.

Each word is defined here once and every loop, the web service and the CLI compare and
produce it through these members. A ``StrEnum`` member equals its string, so database
rows, Temporal payloads and policy inputs carry the same text as before: the columns stay
text (their migrations define them). API filters and CLI options validate against these
enums, so ``--status bogus`` is refused with the allowed values instead of matching
nothing.

This module imports only the standard library: workflows import it too.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Word(StrEnum):
    """A ``StrEnum`` whose ``repr`` is its word's: messages that quote one (``{gate!r}``,
    a list of gates) read as they did when the word was a plain string."""

    def __repr__(self) -> str:
        return repr(self.value)


class RunStatus(Word):
    """Where a training run is."""

    submitted = "submitted"
    starting = "starting"  # the workflow's own state before its first iteration
    running = "running"
    paused = "paused"
    completed = "completed"
    completed_with_alarms = "completed_with_alarms"
    cancelled = "cancelled"
    failed = "failed"


# A run in one of these has ended: `train ... --wait` stops waiting.
FINISHED_RUN_STATUSES = frozenset({RunStatus.completed, RunStatus.completed_with_alarms,
                                   RunStatus.cancelled, RunStatus.failed})


class PromotionStatus(Word):
    """Where a candidate's promotion is."""

    open = "open"
    rejected = "rejected"
    aborted = "aborted"
    promoted = "promoted"
    rolled_back = "rolled_back"
    expired = "expired"
    # Ended outside the workflow's own code: Temporal terminated or cancelled its run, or it
    # failed. Recorded by the workflow (cancelled, failed) or by governance's interruption
    # watch, which reads the server's history (terminated).
    terminated = "terminated"
    cancelled = "cancelled"
    failed = "failed"
    # Only a promotion workflow started again after its promotion ended reports this; no
    # row holds it.
    refused = "refused"


class TaskStatus(Word):
    """A task's admission."""

    pending = "pending"
    admitted = "admitted"
    rejected = "rejected"


class TaskSplit(Word):
    """Which use a task of a task set is for; a digest is in one split only (0026)."""

    train = "train"
    eval = "eval"
    traffic = "traffic"


class GrantStatus(Word):
    """A request for a privileged role."""

    pending = "pending"
    active = "active"
    refused = "refused"


class Gate(Word):
    """A promotion gate. Declared in the order a candidate passes them (``GATE_ORDER``)."""

    STABILITY = "stability"
    OFFLINE_EVAL = "offline_eval"
    SHADOW = "shadow"
    CANARY = "canary"
    AUDIT = "audit"
    APPROVAL = "approval"
    PROMOTE = "promote"
    WATCH = "watch"


# A candidate must pass every gate in this order; none may be skipped.
GATE_ORDER: tuple[Gate, ...] = tuple(Gate)


class Purpose(Word):
    """Why an episode ran (``trajectory.purpose``, ``rollout_batch.purpose``). Production,
    canary and shadow are also the names of the routing slots that serve those episodes, and
    ``production`` of the deployment alias that production serves."""

    TRAINING = "training"
    EVAL = "eval"
    PRODUCTION = "production"
    SHADOW = "shadow"
    CANARY = "canary"


class EpisodeStatus(Word):
    """How an episode ended (``trajectory.status``)."""

    COMPLETED = "completed"
    TRUNCATED = "truncated"  # cut short by a limit or the batch deadline; still usable
    FAILED = "failed"


class DecisionKind(Word):
    """What a person decided about (``human_decision.kind``), and so what ``subject`` names."""

    AUDIT = "audit"  # subject: a promotion; decision: sign | reject
    APPROVAL = "approval"  # subject: a promotion; decision: approve | reject
    ADMISSION = "admission"  # subject: a task; decision: approve | reject
    ROLLBACK = "rollback"  # subject: a deployment alias; decision: rollback
    RUN_CONTROL = "run_control"  # subject: a training run; decision: pause | resume | cancel
    # subject: a promotion; decision: override (its run's stability alarms; comment: why)
    ALARM_OVERRIDE = "alarm_override"
    # subject: an environment's name; decision: register (details: contract text, fixtures)
    ENVIRONMENT_VERSION = "environment_version"
    # subject: an eval set's name; decision: create (details: task ids; frozen at once)
    EVAL_SET = "eval_set"
    # subject: a threshold's name; decision: set (details: spec, eval set)
    THRESHOLD = "threshold"
    # subject: a task set's name; decision: register (details: environment version, source,
    # split rule, tags; a dataset by its sha256 in the artifact store)
    TASK_SET = "task_set"
    # subject: a task set's id; decision: approve | reject (every member task with it)
    TASK_SET_ADMISSION = "task_set_admission"


class Decision(Word):
    """The verb a person's recorded decision holds (``human_decision.decision``)."""

    SIGN = "sign"
    APPROVE = "approve"
    REJECT = "reject"
    OVERRIDE = "override"
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"
    ROLLBACK = "rollback"
    REGISTER = "register"
    CREATE = "create"
    SET = "set"


class PromotionDecision(Word):
    """What a person decides on a promotion: one word from the route to the policy.

    The value is the word the API route, the console form, the policy's action and the
    audit log all use (``sign_audit``). Each member also says, on its own line, the gate it
    belongs to and how the web service records it (``human_decision.kind`` and
    ``.decision``, unchanged in the database): nothing else translates the word.
    """

    gate: Gate
    kind: DecisionKind
    verb: Decision

    def __new__(cls, value: str, *spec: Any) -> PromotionDecision:
        # ``spec`` is (gate, kind, verb) where members are declared; a lookup by value
        # (``PromotionDecision("approve")``) finds the declared member and never comes here.
        member = str.__new__(cls, value)
        member._value_ = value
        member.gate, member.kind, member.verb = spec
        return member

    SIGN_AUDIT = "sign_audit", Gate.AUDIT, DecisionKind.AUDIT, Decision.SIGN
    REJECT_AUDIT = "reject_audit", Gate.AUDIT, DecisionKind.AUDIT, Decision.REJECT
    APPROVE = "approve", Gate.APPROVAL, DecisionKind.APPROVAL, Decision.APPROVE
    REJECT = "reject", Gate.APPROVAL, DecisionKind.APPROVAL, Decision.REJECT
    OVERRIDE_ALARMS = ("override_alarms", Gate.STABILITY, DecisionKind.ALARM_OVERRIDE,
                       Decision.OVERRIDE)

    @property
    def passes(self) -> bool:
        """Whether it lets the candidate go on (so its role must predate the promotion)."""
        return self.verb is not Decision.REJECT

    @property
    def role(self) -> str:
        """The role a person needs to take it."""
        return deciding_role(self.gate)

    @classmethod
    def recorded(cls, kind: str, verb: str) -> PromotionDecision | None:
        """The decision a ``human_decision`` row holds; None when it is no promotion decision."""
        return next((d for d in cls if (d.kind, d.verb) == (kind, verb)), None)

    @classmethod
    def at(cls, gate: Gate) -> tuple[PromotionDecision, ...]:
        """The decisions a person may take at ``gate``."""
        return tuple(d for d in cls if d.gate is gate)

    @classmethod
    def kind_at(cls, gate: Gate) -> DecisionKind:
        """The ``human_decision.kind`` of the decisions taken at ``gate``."""
        return cls.at(gate)[0].kind


def deciding_role(gate: Gate) -> str:
    """The role a person needs to decide at ``gate``: auditor at the audit gate, else operator."""
    return "auditor" if gate is Gate.AUDIT else "operator"
