"""docs/reference.md is the reference generated from the models, never a stale copy."""

from __future__ import annotations

from pathlib import Path

from triloop.contracts import Limits
from triloop.model_reference import field_comments, render
from triloop.run_config import RolloutSection

DOC = Path(__file__).resolve().parents[2] / "docs" / "reference.md"


def test_the_committed_reference_matches_the_models() -> None:
    assert DOC.read_text() == render(), (
        "docs/reference.md is stale: python -m triloop.model_reference > docs/reference.md")


def test_field_descriptions_state_the_units_and_reach_the_reference() -> None:
    # RUN.yaml's fields say it in Field(description=...), which OpenAPI shows too.
    fields = RolloutSection.model_fields
    assert "(seconds)" in (fields["deadline_s"].description or "")
    assert (fields["group_size"].description or "").startswith("Samples per group")
    assert fields["deadline_s"].description in render()


def test_field_comments_read_the_units_the_source_states() -> None:
    # The contract's models still say it in comments, which the reference reads.
    assert "seconds" in field_comments(Limits)["wall_time_s"]
