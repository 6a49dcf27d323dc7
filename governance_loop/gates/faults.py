"""A fault may make a gate fail, never pass.

An operator's game-day fault (``outcome.injected_fault`` on every episode it touched)
degrades how one checkpoint is served. Degraded episodes are real evidence that
something is wrong when they point at the candidate (a regression: abort or roll
back), but they are not evidence that the candidate is good: a fault on the
*production* side makes any candidate look better. So each gate is decided twice,
on all episodes and on the episodes no fault touched: a failing verdict on all of
them stands; anything else is replaced by the verdict on the clean episodes alone.
Either way the decision names the faults and how many episodes they touched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from governance_loop.gates.decision import GateDecision, Verdict

FAILING = frozenset({Verdict.FAIL, Verdict.ABORT_REGRESSION, Verdict.ROLLBACK})


def describe_fault(fault: Mapping[str, Any]) -> str:
    """One fault in words: which checkpoint, how it was degraded, and why."""
    return (f"checkpoint {fault.get('checkpoint_id')} served at temperature "
            f"{fault.get('temperature')} ({fault.get('note')})")


def without_fault_passes(
    *, all_episodes: GateDecision, clean_episodes: GateDecision,
    faults: Sequence[Mapping[str, Any]], faulted_episodes: int,
) -> GateDecision:
    """The gate's decision when some of its episodes were served under an injected fault."""
    if not faults:
        return all_episodes
    named = "; ".join(describe_fault(f) for f in faults)
    evidence = {"injected_faults": [dict(f) for f in faults],
                "episodes_under_fault": faulted_episodes}
    if all_episodes.verdict in FAILING:
        return replace(
            all_episodes,
            reasons=[*all_episodes.reasons,
                     f"{faulted_episodes} episode(s) of this evidence were served under an "
                     f"injected fault: {named}"],
            evidence={**all_episodes.evidence, **evidence},
        )
    return replace(
        clean_episodes,
        reasons=[*clean_episodes.reasons,
                 f"{faulted_episodes} episode(s) served under an injected fault ({named}) were "
                 "left out: a fault can make a gate fail, never pass"],
        evidence={**clean_episodes.evidence, **evidence,
                  "verdict_with_faulted_episodes": all_episodes.verdict.value},
    )
