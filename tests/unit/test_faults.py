"""The serving-fault file: written atomically, read defensively."""

from __future__ import annotations

from pathlib import Path

import pytest

from triloop.faults import (
    ServingFault,
    clear_serving_faults,
    faults_file,
    inject_serving_fault,
    read_serving_faults,
)


def test_inject_read_clear(tmp_path: Path) -> None:
    assert read_serving_faults(tmp_path) == {}
    inject_serving_fault(tmp_path, ServingFault("c1", 3.0, "game day"))
    inject_serving_fault(tmp_path, ServingFault("c2", 2.0, "other"))
    inject_serving_fault(tmp_path, ServingFault("c1", 4.0, "harder"))
    faults = read_serving_faults(tmp_path)
    assert faults["c1"] == ServingFault("c1", 4.0, "harder") and set(faults) == {"c1", "c2"}
    assert clear_serving_faults(tmp_path) == 2
    assert read_serving_faults(tmp_path) == {}


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_temperature_is_refused(tmp_path: Path, temperature: float) -> None:
    with pytest.raises(ValueError, match="temperature"):
        inject_serving_fault(tmp_path, ServingFault("c", temperature, "x"))
    assert read_serving_faults(tmp_path) == {}


def test_unreadable_file_injects_nothing(tmp_path: Path) -> None:
    faults_file(tmp_path).parent.mkdir(parents=True)
    faults_file(tmp_path).write_text("{not json")
    assert read_serving_faults(tmp_path) == {}
    faults_file(tmp_path).write_text('{"c": {"temp": 3}}')
    assert read_serving_faults(tmp_path) == {}
