"""docs/reference.md is the reference generated from the models, never a stale copy."""

from __future__ import annotations

from pathlib import Path

from triloop.model_reference import field_comments, render
from triloop.run_config import RolloutSection

DOC = Path(__file__).resolve().parents[2] / "docs" / "reference.md"


def test_the_committed_reference_matches_the_models() -> None:
    assert DOC.read_text() == render(), (
        "docs/reference.md is stale: python -m triloop.model_reference > docs/reference.md")


def test_field_comments_read_the_units_the_source_states() -> None:
    comments = field_comments(RolloutSection)
    assert "(seconds)" in comments["deadline_s"]
    assert comments["group_size"].startswith("Samples per group")
