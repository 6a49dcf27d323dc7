"""The pure parts of the audit log for people: the vocabulary matches the policy's, a run's
iterations fold on the lineage page, and rows link to their resource's page."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from web.audit_vocabulary import POLICY_ACTIONS, POLICY_KINDS, AuditAction, AuditKind
from web.console.pages_audit import resource_link
from web.data.lineage import CheckpointPublic, Lineage, LineageNode, segments

POLICY_VOCABULARY = Path(__file__).parents[2] / "policies/triloop/authz/vocabulary.rego"


def _rego_set(name: str) -> set[str]:
    text = POLICY_VOCABULARY.read_text()
    found = re.search(rf"^{name} := \{{(.*?)\}}", text, re.S | re.M)
    assert found, name
    return set(re.findall(r'"([a-z_]+)"', found.group(1)))


def test_the_vocabulary_holds_the_policys_actions_and_kinds() -> None:
    assert set(POLICY_ACTIONS) == _rego_set("actions")
    assert set(POLICY_KINDS) == _rego_set("kinds")
    assert set(POLICY_ACTIONS) <= set(AuditAction) and set(POLICY_KINDS) <= set(AuditKind)
    for recorded in ("gate_result", "workflow_reset", "approval_decision", "refuse_promote",
                     "task_admitted", "integrity_violation"):
        assert recorded in AuditAction.__members__


def _node(ident: str, parent: str | None, run: str | None, iteration: int | None,
          aliases: tuple[str, ...] = ()) -> LineageNode:
    return LineageNode(checkpoint=CheckpointPublic(
        id=ident, parent_id=parent, run_id=run, base_model="tiny", iteration=iteration,
        environment_version_ids=[], data={}, artifact_uri="file:///x", created_by="learning",
        created_at=datetime.now(UTC)), environments=[], aliases=list(aliases))


def _lineage(nodes: list[LineageNode]) -> Lineage:
    return Lineage(candidate_id=nodes[-1].checkpoint.id, base_model="tiny", chain=nodes,
                   truncated=False, promotions=[], eval_sets=[])


def test_the_base_is_left_to_the_base_node_and_a_long_run_folds() -> None:
    chain = [_node("base", None, None, None)]
    for i in range(1, 17):
        chain.append(_node(f"c{i}", chain[-1].checkpoint.id, "run-a", i,
                           ("production",) if i == 9 else ()))
    drawn = segments(_lineage(chain))
    assert [s.node.checkpoint.id if s.node else len(s.folded) for s in drawn] == [
        "c1", 7, "c9", 6, "c16"]  # the base is not among them; an alias is never folded


def test_short_runs_and_a_second_run_stay_drawn() -> None:
    chain = [_node("base", None, None, None), _node("a1", "base", "run-a", 1),
             _node("a2", "a1", "run-a", 2), _node("b1", "a2", "run-b", 1)]
    assert [s.node.checkpoint.id for s in segments(_lineage(chain)) if s.node] == [
        "a1", "a2", "b1"]
    truncated = [_node("x1", "gone", "run-a", 5), _node("x2", "x1", "run-a", 6)]
    assert [s.node.checkpoint.id for s in segments(_lineage(truncated)) if s.node] == [
        "x1", "x2"]  # no root in the chain: every node is drawn


def test_rows_link_to_their_resource() -> None:
    assert resource_link({"kind": "promotion", "id": "p/1"}) == "/promotions/p%2F1"
    assert resource_link({"kind": "checkpoint", "id": "abc"}) == "/checkpoints/abc/lineage"
    assert resource_link({"kind": "deployment", "id": "production"}) == \
        "/deployments#history-production"
    assert resource_link({"kind": "promotion"}) is None
    assert resource_link({"kind": "workflow", "id": "w"}) is None
