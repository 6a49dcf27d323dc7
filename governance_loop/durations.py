"""How long each promotion gate waits: soak periods, human deadlines, the watch period.

``PromotionTiming`` is the one type of gate timing: the worker picks it by
``settings.gate_profile`` (``for_profile``), ``open_promotion`` hands it to the workflow in
its plan (recorded once in each promotion's history, since workflows cannot read
settings), and the workflow turns it into durable timers, so a worker restart never
shortens or restarts a soak.

All values are seconds (``canary_share`` is a fraction). Production defaults are measured
in days because a candidate must face real traffic through weekly patterns before it earns
production; the test profile gives seconds so a whole promotion runs in a test (with
Temporal's time-skipping server, durations cost no wall-clock time). Plain data with the
standard library only: workflows import it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

HOUR = 3600.0
DAY = 24 * HOUR
# Seconds a routing claim outlives its gate's soak (``PromotionTiming.claim_s``).
CLAIM_GRACE_S = 15 * 60.0


@dataclass(frozen=True)
class PromotionTiming:
    """Timing of the promotion gates, in seconds (canary share is a fraction)."""

    # Seconds the candidate shadows production.
    shadow_soak_s: float = 2 * DAY
    # Seconds the canary share is routed to the candidate.
    canary_soak_s: float = 3 * DAY
    # Fraction of production episodes routed to the candidate during the canary; at most
    # half, so production keeps the larger comparison arm.
    canary_share: float = 0.1
    # Seconds between canary sequential-test looks (an abort waits at most this long).
    canary_check_interval_s: float = HOUR
    # Seconds an auditor has to sign or reject; past it the promotion is rejected (fail
    # closed).
    audit_deadline_s: float = 7 * DAY
    # Seconds an operator has to approve or reject after the audit; past it the promotion
    # is rejected. Also the deadline of an admission decision and of an alarm override.
    approval_deadline_s: float = 7 * DAY
    # Seconds after promotion during which a regression rolls back automatically.
    watch_period_s: float = 7 * DAY
    # Seconds between watch looks.
    watch_check_interval_s: float = HOUR
    # Seconds an offline-eval rollout batch may take.
    eval_timeout_s: float = DAY
    # Seconds between tries for a routing slot another promotion holds.
    slot_wait_interval_s: float = HOUR

    def __post_init__(self) -> None:
        for item in fields(self):
            if not getattr(self, item.name) > 0:
                raise ValueError(f"{item.name} must be greater than 0")
        if self.canary_share > 0.5:
            raise ValueError(f"canary_share ({self.canary_share}) must be at most 0.5")
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

    def claim_s(self, slot: str) -> float:
        """Seconds a shadow or canary claim serves unless released: the soak plus a grace.

        The workflow releases its slot when the gate ends; the expiry is for a promotion
        that can no longer release it (terminated, its worker gone), so the claim clears
        itself without anyone. The grace covers the judging after the soak and a short
        outage of the governance worker; past it a slow gate simply sees less traffic.
        """
        soak = self.shadow_soak_s if slot == "shadow" else self.canary_soak_s
        return soak + CLAIM_GRACE_S

    @classmethod
    def for_profile(cls, profile: str) -> PromotionTiming:
        """Soaks and deadlines for a profile: days (production), minutes (demo), seconds
        (test)."""
        match profile:
            case "production":
                return cls()
            case "demo":
                return cls(shadow_soak_s=30.0, canary_soak_s=45.0, canary_share=0.5,
                           canary_check_interval_s=5.0, audit_deadline_s=3600.0,
                           approval_deadline_s=3600.0, watch_period_s=90.0,
                           watch_check_interval_s=5.0, eval_timeout_s=1800.0,
                           slot_wait_interval_s=5.0)
            case "test":
                return cls.for_tests()
        raise ValueError(f"unknown gate profile {profile!r}: production, demo or test")

    @classmethod
    def for_tests(cls) -> PromotionTiming:
        """Durations in seconds, for tests."""
        return cls(shadow_soak_s=2.0, canary_soak_s=3.0, canary_share=0.5,
                   canary_check_interval_s=1.0, audit_deadline_s=30.0,
                   approval_deadline_s=30.0, watch_period_s=3.0, watch_check_interval_s=1.0,
                   eval_timeout_s=120.0, slot_wait_interval_s=1.0)

