"""All tables; importing this module registers them on ``SQLModel.metadata``."""

from triloop.models.audit import AccessEvent, AuditEvent
from triloop.models.decisions import DecisionKind, DecisionUse, HumanDecisionRow
from triloop.models.environments import (
    Environment,
    EnvironmentVersion,
    Task,
    TaskSet,
    TaskSetMember,
)
from triloop.models.evaluation import EvalItem, EvalSet, Threshold
from triloop.models.governance import (
    Approval,
    Deployment,
    DeploymentHistory,
    GateResult,
    Promotion,
    Routing,
    WorkflowInterruption,
)
from triloop.models.training import Checkpoint, Proposal, TrainingRun, TrainingStep
from triloop.models.trajectories import (
    RolloutBatch,
    Step,
    Trajectory,
    TrajectorySequence,
    Verdict,
)
from triloop.models.users import ApiToken, ConsoleSession, RoleGrant, User
from triloop.models.webhooks import Webhook, WebhookDelivery

__all__ = [
    "ApiToken",
    "Approval",
    "AccessEvent",
    "AuditEvent",
    "Checkpoint",
    "ConsoleSession",
    "DecisionKind",
    "DecisionUse",
    "Deployment",
    "DeploymentHistory",
    "Environment",
    "EnvironmentVersion",
    "EvalItem",
    "EvalSet",
    "GateResult",
    "HumanDecisionRow",
    "Promotion",
    "Proposal",
    "RoleGrant",
    "Routing",
    "WorkflowInterruption",
    "Step",
    "Task",
    "TaskSet",
    "TaskSetMember",
    "Threshold",
    "TrainingRun",
    "TrainingStep",
    "RolloutBatch",
    "Verdict",
    "Trajectory",
    "TrajectorySequence",
    "User",
    "Webhook",
    "WebhookDelivery",
]
