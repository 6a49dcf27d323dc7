"""triloop's custom Temporal search attributes: find a workflow by what the console shows.

Every workflow triloop starts carries the ids a person looks for (run, candidate,
proposal, the person who caused it, the loop it belongs to), so that Temporal's
UI or CLI answers ``TriloopRunId = "run-…"`` or ``TriloopUser = "olga"``. A
promotion also ends with ``TriloopOutcome`` (promoted, rolled_back, rejected, ...),
because Temporal itself shows every promotion that returned as COMPLETED.

``dev up`` and the test fixtures register the attributes in each loop's namespace
(``register_search_attributes``); on another cluster, an operator runs the same
once (``triloop dev up`` does it when it provisions, or ``temporal operator
search-attribute create`` with the names and types below).
"""

from __future__ import annotations

from collections.abc import Mapping

from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
)

RUN_ID = SearchAttributeKey.for_keyword("TriloopRunId")
CANDIDATE = SearchAttributeKey.for_keyword("TriloopCandidate")
PROPOSAL = SearchAttributeKey.for_keyword("TriloopProposal")
USER = SearchAttributeKey.for_keyword("TriloopUser")
LOOP = SearchAttributeKey.for_keyword("TriloopLoop")
OUTCOME = SearchAttributeKey.for_keyword("TriloopOutcome")

ALL: tuple[SearchAttributeKey[str], ...] = (RUN_ID, CANDIDATE, PROPOSAL, USER, LOOP, OUTCOME)


def attributes(
    *, loop: str, run_id: str | None = None, candidate: str | None = None,
    proposal: str | None = None, user: str | None = None,
) -> TypedSearchAttributes:
    """The search attributes a workflow starts with (only the ids it has)."""
    values: Mapping[SearchAttributeKey[str], str | None] = {
        LOOP: loop, RUN_ID: run_id, CANDIDATE: candidate, PROPOSAL: proposal, USER: user}
    return TypedSearchAttributes([SearchAttributePair(key, value)
                                  for key, value in values.items() if value])
