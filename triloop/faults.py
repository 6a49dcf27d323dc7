"""Serving faults injected on purpose (game days, the demo's regression).

An operator degrades how one checkpoint is served, to check that the watch gate
notices and rolls back. The fault lives in ``<home>/faults/serving.json`` so the
running execution workers pick it up at their next episode; it is recorded on
every trajectory it touches (``outcome.injected_fault``), so nobody mistakes an
injected regression for a real one. Nothing is injected unless the file exists.

Only the web service writes the file, for an operator that OPA allowed
(``web.faults``; ``triloop faults`` calls that API with the operator's token), and
both the decision and the change are audited. Whoever else can write the file can
only make gates fail: governance never counts a fault-marked episode toward a pass.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServingFault:
    """Serve ``checkpoint_id`` at this sampling temperature instead of the requested one."""

    checkpoint_id: str
    temperature: float
    note: str


def faults_file(home: Path) -> Path:
    """Where serving faults are kept for a stack."""
    return home / "faults" / "serving.json"


def read_serving_faults(home: Path) -> dict[str, ServingFault]:
    """Faults by checkpoint id; an absent or unreadable file injects nothing (and says so)."""
    path = faults_file(home)
    try:
        document = json.loads(path.read_text())
        return {
            checkpoint: ServingFault(checkpoint, float(spec["temperature"]), str(spec["note"]))
            for checkpoint, spec in document.items()
        }
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        log.warning("ignoring unreadable serving faults in %s: %s", path, error)
        return {}


def inject_serving_fault(home: Path, fault: ServingFault) -> None:
    """Add or replace one checkpoint's fault (atomic write)."""
    if not math.isfinite(fault.temperature) or fault.temperature <= 0:
        raise ValueError(f"temperature must be a positive number, got {fault.temperature}")
    faults = read_serving_faults(home)
    faults[fault.checkpoint_id] = fault
    _write(home, {c: {"temperature": f.temperature, "note": f.note} for c, f in faults.items()})


def clear_serving_faults(home: Path) -> int:
    """Remove every fault; return how many there were."""
    count = len(read_serving_faults(home))
    faults_file(home).unlink(missing_ok=True)
    return count


def describe(fault: ServingFault) -> dict[str, object]:
    """The fault as recorded on a trajectory."""
    return asdict(fault)


def _write(home: Path, document: dict[str, dict[str, object]]) -> None:
    path = faults_file(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent)
    # The web service writes it, the execution worker (another OS user, in the faults
    # folder's group) reads it; mkstemp's 0600 would hide it from the reader.
    os.fchmod(fd, 0o640)
    with os.fdopen(fd, "w") as handle:
        json.dump(document, handle, indent=2)
    os.replace(tmp, path)
