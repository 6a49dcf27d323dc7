"""A typed handle for one activity: its name, input, output, timeout and retry in one place.

Workflows cannot import the activity classes (they pull in torch, the database and
network clients, which the workflow sandbox refuses), so they used to call activities by
string name with a separate ``result_type=`` and per-module timeout constants. A
contract declares all of that once, beside the messages it carries, and its ``call``
is typed: mypy checks the argument against ``In`` and the result is an ``Out``. The
activity implementation registers under the same name with
``@activity.defn(name=CONTRACT.name)``, so the name is written exactly once.

Names follow ``<loop>.<verb>_<noun>`` (``learning.update_policy``); ``tests/unit`` checks
every contract against the activities the loop's worker registers. A contract renamed to
that scheme keeps its old wire name as ``legacy_name``: a workflow whose history was
recorded before the rename (a promotion runs for days) replays with the old name, guarded
by Temporal's own versioning (``workflow.patched(ACTIVITY_NAMES_PATCH)``), and schedules
every new activity under the new one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Generic, TypeVar, cast

from temporalio import workflow
from temporalio.common import RetryPolicy

In = TypeVar("In")
Out = TypeVar("Out")

ACTIVITY_NAME = re.compile(r"^(execution|learning|governance)\.[a-z]+(_[a-z0-9]+)*$")
ACTIVITY_NAMES_PATCH = "triloop-activity-names-loop-dot-verb-noun"


@dataclass(frozen=True)
class ActivityContract(Generic[In, Out]):
    """One activity as a workflow sees it; ``output`` is ``type(None)`` for no result."""

    name: str
    input: type[In]
    output: type[Out]
    start_to_close: timedelta
    retry: RetryPolicy
    heartbeat: timedelta | None = None
    legacy_name: str | None = None  # the wire name before the rename; histories replay it

    def __post_init__(self) -> None:
        if not ACTIVITY_NAME.match(self.name):
            raise ValueError(
                f"activity name {self.name!r} does not follow <loop>.<verb>_<noun>")

    async def call(
        self, arg: In, *, task_queue: str | None = None,
        schedule_to_close: timedelta | None = None, heartbeat: timedelta | None = None,
        retry: RetryPolicy | None = None,
    ) -> Out:
        """Run the activity from a workflow and return its typed result.

        ``schedule_to_close`` (a deadline the caller computes, such as a batch's) replaces
        the contract's start-to-close bound; ``heartbeat`` and ``retry`` override the
        contract's (a person waiting on an update wants fewer retries than a timer).
        """
        self._check(arg)
        result = await workflow.execute_activity(
            self.wire_name(), arg, result_type=self.output, task_queue=task_queue,
            retry_policy=retry or self.retry,
            start_to_close_timeout=None if schedule_to_close else self.start_to_close,
            schedule_to_close_timeout=schedule_to_close,
            heartbeat_timeout=heartbeat or self.heartbeat,
        )
        return cast(Out, result)

    def start(
        self, arg: In, *, task_queue: str | None = None, heartbeat: timedelta | None = None,
    ) -> workflow.ActivityHandle[Out]:
        """Start the activity and return its handle (for work that overlaps other work)."""
        self._check(arg)
        return workflow.start_activity(
            self.wire_name(), arg, result_type=self.output, task_queue=task_queue,
            retry_policy=self.retry, start_to_close_timeout=self.start_to_close,
            heartbeat_timeout=heartbeat or self.heartbeat,
        )

    def wire_name(self) -> str:
        """The name to schedule under: the legacy one only while replaying an older history."""
        if self.legacy_name is None or workflow.patched(ACTIVITY_NAMES_PATCH):
            return self.name
        return self.legacy_name

    def _check(self, arg: In) -> None:
        if not isinstance(arg, self.input):
            raise TypeError(
                f"{self.name} takes {self.input.__name__}, got {type(arg).__name__}")
