"""A typed handle for one activity: its name, input, output, timeout and retry in one place.

Workflows cannot import the activity classes (they pull in torch, the database and
network clients, which the workflow sandbox refuses), so they used to call activities by
string name with a separate ``result_type=`` and per-module timeout constants. A
contract declares all of that once, beside the messages it carries, and its ``call``
is typed: mypy checks the argument against ``In`` and the result is an ``Out``. The
activity implementation registers under the same name with
``@activity.defn(name=CONTRACT.name)``, so the name is written exactly once.

Names follow ``<loop>.<verb>_<noun>`` (``learning.update_policy``); ``tests/unit`` checks
every contract against the activities the loop's worker registers.
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


@dataclass(frozen=True)
class ActivityContract(Generic[In, Out]):
    """One activity as a workflow sees it; ``output`` is ``type(None)`` for no result."""

    name: str
    input: type[In]
    output: type[Out]
    start_to_close: timedelta
    retry: RetryPolicy
    heartbeat: timedelta | None = None

    def __post_init__(self) -> None:
        if not ACTIVITY_NAME.match(self.name):
            raise ValueError(
                f"activity name {self.name!r} does not follow <loop>.<verb>_<noun>")

    async def call(
        self, arg: In, *, task_queue: str | None = None,
        schedule_to_close: timedelta | None = None, heartbeat: timedelta | None = None,
    ) -> Out:
        """Run the activity from a workflow and return its typed result.

        ``schedule_to_close`` (a deadline the caller computes, such as a batch's) replaces
        the contract's start-to-close bound; ``heartbeat`` overrides the contract's.
        """
        self._check(arg)
        result = await workflow.execute_activity(
            self.name, arg, result_type=self.output, task_queue=task_queue,
            retry_policy=self.retry,
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
            self.name, arg, result_type=self.output, task_queue=task_queue,
            retry_policy=self.retry, start_to_close_timeout=self.start_to_close,
            heartbeat_timeout=heartbeat or self.heartbeat,
        )

    def _check(self, arg: In) -> None:
        if not isinstance(arg, self.input):
            raise TypeError(
                f"{self.name} takes {self.input.__name__}, got {type(arg).__name__}")
