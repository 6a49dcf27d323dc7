"""How long each promotion gate waits: soak periods, human deadlines, the watch period.

All values are seconds. Production defaults are measured in days because a
candidate must face real traffic through weekly patterns before it earns
production; ``for_tests()`` gives seconds so a whole promotion runs in a test
(with Temporal's time-skipping server, durations cost no wall-clock time). The
workflow turns these into durable timers, so a worker restart never shortens
or restarts a soak.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field, model_validator

HOUR = 3600.0
DAY = 24 * HOUR


class GateDurations(BaseModel):
    """Timing of the promotion gates, in seconds (canary share is a fraction)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    shadow_soak_s: float = Field(
        default=2 * DAY, gt=0, description="Seconds the candidate shadows production."
    )
    canary_soak_s: float = Field(
        default=3 * DAY, gt=0, description="Seconds the canary share is routed to the candidate."
    )
    canary_share: float = Field(
        default=0.1,
        gt=0,
        le=0.5,
        description="Fraction of production episodes routed to the candidate during the "
        "canary; at most half, so production keeps the larger comparison arm.",
    )
    canary_check_interval_s: float = Field(
        default=HOUR,
        gt=0,
        description="Seconds between canary sequential-test looks (an abort waits at most "
        "this long).",
    )
    audit_deadline_s: float = Field(
        default=7 * DAY,
        gt=0,
        description="Seconds an auditor has to sign or reject; past it the promotion is "
        "rejected (fail closed).",
    )
    approval_deadline_s: float = Field(
        default=7 * DAY,
        gt=0,
        description="Seconds an operator has to approve or reject after the audit; past it "
        "the promotion is rejected.",
    )
    watch_period_s: float = Field(
        default=7 * DAY,
        gt=0,
        description="Seconds after promotion during which a regression rolls back "
        "automatically.",
    )
    watch_check_interval_s: float = Field(
        default=HOUR, gt=0, description="Seconds between watch looks."
    )

    @model_validator(mode="after")
    def _intervals_fit(self) -> GateDurations:
        if self.canary_check_interval_s > self.canary_soak_s:
            raise ValueError(
                f"canary_check_interval_s ({self.canary_check_interval_s}) must not exceed "
                f"canary_soak_s ({self.canary_soak_s})"
            )
        if self.watch_check_interval_s > self.watch_period_s:
            raise ValueError(
                f"watch_check_interval_s ({self.watch_check_interval_s}) must not exceed "
                f"watch_period_s ({self.watch_period_s})"
            )
        return self

    @classmethod
    def for_tests(cls) -> GateDurations:
        """Durations in seconds, for tests and the demo."""
        return cls(
            shadow_soak_s=2.0,
            canary_soak_s=3.0,
            canary_share=0.5,
            canary_check_interval_s=1.0,
            audit_deadline_s=30.0,
            approval_deadline_s=30.0,
            watch_period_s=3.0,
            watch_check_interval_s=1.0,
        )

    def as_timedelta(self, field_name: str) -> timedelta:
        """One ``*_s`` field as a ``timedelta`` for ``workflow.sleep`` or a timeout."""
        if not field_name.endswith("_s") or field_name not in type(self).model_fields:
            names = [n for n in type(self).model_fields if n.endswith("_s")]
            raise KeyError(f"{field_name!r} is not a duration; use one of {names}")
        return timedelta(seconds=float(getattr(self, field_name)))
