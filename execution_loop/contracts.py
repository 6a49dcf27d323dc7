"""The execution loop's activities: the messages each one takes and returns, and its contract.

``RolloutWorkflow`` and ``AdmissionProbeWorkflow`` call the activities through these
``ActivityContract`` handles; the activity classes register under ``CONTRACT.name``.
Plain dataclasses only (no torch, database or network), so the workflow sandbox can
import this module. Renamed to ``execution.<verb>_<noun>``, each keeps its earlier wire
name as ``legacy_name`` for histories recorded before (see ``triloop.activity_contract``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from temporalio.common import RetryPolicy

from triloop.activity_contract import ActivityContract
from triloop.workflow_api import (
    AdmissionProbeEvidence,
    AdmissionProbeInput,
    DescribeTasksInput,
    DescribeTasksResult,
)


@dataclass
class EpisodeSpec:
    """One episode: what to run and under which id, checkpoint and purpose."""

    episode_id: str
    task_id: str
    task_seed: int
    group_id: str
    sample_index: int
    checkpoint_id: str
    purpose: str
    shadow_checkpoint_id: str | None = None  # production: who acts beside it, unapplied
    shadow_of: str | None = None  # shadow: the production episode it mirrors
    continues: str | None = None  # partial rollouts: the cut episode it replays, then goes on


@dataclass
class EpisodeInput:
    """The episode activity's input: the spec and the batch's settings."""

    spec: EpisodeSpec
    batch_id: str
    run_id: str | None
    policy_version: int
    temperature: float
    deadline_epoch_s: float  # Unix time; the episode stops at its next turn after it
    max_turns: int | None = None  # None: the contract's limit; never raises it
    max_new_tokens: int | None = None  # per turn; None: the contract's; never raises it


@dataclass
class EpisodeSummary:
    """What the activity stored (or found already stored) for one episode."""

    episode_id: str
    status: str
    success: bool = False
    total_reward: float = 0.0
    num_steps: int = 0
    written: bool = True  # False: a previous attempt had stored it already
    checkpoint_id: str | None = None  # who served it (a production episode may be rerouted)
    failure_reason: str | None = None  # why it was truncated or failed


# The error type of an episode group that stalled (an episode without progress for the
# heartbeat timeout): its message names the stage.
HEARTBEAT_TIMEOUT = "HeartbeatTimeout"


@dataclass
class HeartbeatReport:
    """An episode activity's heartbeat details after the steps count: what it was doing.

    ``stage`` is the least recently lively running episode's stage in words ("decoding
    turn 3 of episode b:0:1 (12 tokens so far)"); when the attempt times out, the last
    report that reached the server says where it stopped moving.
    """

    steps: int = 0  # steps (or agent model calls) done by the activity's episodes (count)
    stage: str = ""  # empty: no episode running (all queued for a slot, or all finished)
    silent_s: float = 0.0  # how long that episode had been without progress (seconds)


@dataclass
class EpisodeGroupInput:
    """Episodes of one group (or a chunk of one) played together by one activity."""

    episodes: list[EpisodeInput]


@dataclass
class EpisodeGroupResult:
    """Every stored episode of the group, and why each of the others stored nothing."""

    summaries: list[EpisodeSummary] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


@dataclass
class RouteInput:
    """Production episode ids to route."""

    episode_ids: list[str]


@dataclass
class RouteDecision:
    """Who serves one episode (checkpoint, purpose production|canary) and who shadows it."""

    episode_id: str
    checkpoint_id: str
    purpose: str
    shadow_checkpoint_id: str | None = None


@dataclass
class RouteResult:
    """One decision per episode, in input order."""

    decisions: list[RouteDecision] = field(default_factory=list)


@dataclass
class TruncateInput:
    """Episodes the deadline left without a trajectory row."""

    episodes: list[EpisodeInput]
    reason: str = "batch_deadline"
    # False: only report what is stored (episodes of a group that failed for good).
    record_missing: bool = True
    # Episode id -> its own reason, where not ``reason`` (a group lost to a heartbeat
    # timeout: "heartbeat_timeout").
    reasons: dict[str, str] = field(default_factory=dict)


@dataclass
class TruncateResult:
    """Status stored for each episode after recording (an earlier write wins)."""

    statuses: dict[str, str] = field(default_factory=dict)


# Infrastructure errors: retry with backoff while the batch deadline allows. An episode's
# bound is the deadline the workflow computes (``schedule_to_close``), never this hour.
EPISODE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30), maximum_attempts=10,
)
EPISODE_BOUND = timedelta(hours=1)
# Routing and truncation records: short database work.
QUICK_TIMEOUT = timedelta(seconds=60)
QUICK_RETRY = RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=10))
# The admission probe resets the environment and runs its reference solution k times.
PROBE_TIMEOUT = timedelta(minutes=30)
PROBE_RETRY = RetryPolicy(maximum_attempts=3)

RUN_EPISODE = ActivityContract(
    "execution.run_episode", EpisodeInput, EpisodeSummary, EPISODE_BOUND, EPISODE_RETRY,
    legacy_name="run_episode_activity")
RUN_EPISODE_GROUP = ActivityContract(
    "execution.run_episode_group", EpisodeGroupInput, EpisodeGroupResult, EPISODE_BOUND,
    EPISODE_RETRY, legacy_name="run_episode_group_activity")
ROUTE_EPISODES = ActivityContract(
    "execution.route_production_episodes", RouteInput, RouteResult, QUICK_TIMEOUT, QUICK_RETRY,
    legacy_name="route_production_episodes")
RECORD_TRUNCATED = ActivityContract(
    "execution.record_truncated_episodes", TruncateInput, TruncateResult, QUICK_TIMEOUT,
    QUICK_RETRY, legacy_name="record_truncated_episodes")
# Describing a task set's tasks: one describe per task (a fixture's bytes, a reset); it
# heartbeats as it goes, so a lost worker is noticed within the heartbeat timeout.
DESCRIBE_TIMEOUT = timedelta(hours=1)
DESCRIBE_HEARTBEAT = timedelta(minutes=2)
DESCRIBE_TASKS = ActivityContract(
    "execution.describe_tasks", DescribeTasksInput, DescribeTasksResult, DESCRIBE_TIMEOUT,
    PROBE_RETRY, heartbeat=DESCRIBE_HEARTBEAT)
PROBE_ADMISSION = ActivityContract(
    "execution.probe_admission", AdmissionProbeInput, AdmissionProbeEvidence, PROBE_TIMEOUT,
    PROBE_RETRY, legacy_name="probe_admission")
