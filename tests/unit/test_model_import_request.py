"""The web service's model-import request: one source, a valid name, defaults (pure)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from web.data.lineage import looks_like_path
from web.model_imports import ModelImportRequest, default_import_name


def test_default_names_come_from_the_example_or_the_source() -> None:
    assert ModelImportRequest(example="smollm2").import_name() == "smollm2"
    assert ModelImportRequest(source="/m/SmolLM2-135M-Instruct.Q4_1.gguf").import_name() \
        == "SmolLM2-135M-Instruct.Q4_1"
    assert ModelImportRequest(source="/models/my model/").import_name() == "my-model"
    assert ModelImportRequest(source="/m/x", name="mine").import_name() == "mine"
    assert default_import_name("/m/deadbeef") == "model-deadbeef"  # never id-like


@pytest.mark.parametrize(("body", "needle"), [
    ({}, "exactly one"),
    ({"source": "/a", "example": "smollm2"}, "exactly one"),
    ({"source": "models/a"}, "absolute path"),
    ({"example": "gpt5"}, "no example model"),
    ({"source": "/a", "name": "abc123"}, "looks like a checkpoint id"),
    ({"source": "/a", "name": "-dash"}, "name"),
])
def test_bad_requests_are_refused_naming_the_field(body: dict[str, str], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        ModelImportRequest.model_validate(body)


def test_a_base_with_a_slash_is_a_directory_and_a_name_is_not() -> None:
    assert looks_like_path("/models/tiny") and looks_like_path(".triloop/models/tiny")
    assert looks_like_path("./tiny") and not looks_like_path("smollm2")
