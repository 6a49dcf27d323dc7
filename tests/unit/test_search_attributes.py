"""The search attributes a workflow starts with: only the ids it has, under triloop's keys."""

from __future__ import annotations

from triloop import search_attributes as sa


def test_attributes_carry_only_the_ids_given() -> None:
    found = sa.attributes(loop="governance", run_id="run-1", candidate="sha-c",
                          proposal="prop-1", user=None)
    assert found.get(sa.LOOP) == "governance" and found.get(sa.RUN_ID) == "run-1"
    assert found.get(sa.CANDIDATE) == "sha-c" and found.get(sa.PROPOSAL) == "prop-1"
    assert found.get(sa.USER) is None and len(found) == 4
    assert {key.name for key in sa.ALL} == {
        "TriloopRunId", "TriloopCandidate", "TriloopProposal", "TriloopUser", "TriloopLoop",
        "TriloopOutcome"}
