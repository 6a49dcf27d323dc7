"""What ``triloop train`` prints about a run's progress and its proposals: the API's own
words (``progress.summary``, ``progress.starved.message``, from ``web.data.run_progress``),
so the terminal and the console say the same thing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def number_text(value: float | None) -> str:
    """A reward as a table shows it ("" when there is none)."""
    return "" if value is None else f"{value:.4g}"


def share_text(value: float | None) -> str:
    """A success rate (0..1) as a percentage ("" when there is none)."""
    return "" if value is None else f"{value:.0%}"


def progress_line(run_id: str, metrics: Mapping[str, Any]) -> str:
    """``run R: running, iteration 3 of 10, elapsed 1 min 02 s, about 2 min 20 s left``."""
    progress = metrics.get("progress") or {}
    summary = progress.get("summary") or f"{metrics['iterations_done']} iterations done"
    return f"run {run_id}: {metrics['status']}, {summary}"


def starved_line(run_id: str, metrics: Mapping[str, Any]) -> str:
    """The warning that the run's rollouts are starved, or "" while they are not."""
    starved = (metrics.get("progress") or {}).get("starved")
    return f"run {run_id}: {starved['message']}" if starved else ""


def proposed_lines(proposed: Sequence[Mapping[str, Any]], api_url: str) -> list[str]:
    """One line per candidate the run proposed, with its promotion and where to see it."""
    if not proposed:
        return ["it proposed no candidate"]
    base = api_url.rstrip("/")
    lines = []
    for candidate in proposed:
        at = (f" (iteration {candidate['iteration']})"
              if candidate.get("iteration") is not None else "")
        head = f"proposed candidate {candidate['checkpoint_id']}{at}"
        promotion = candidate.get("promotion_id")
        if promotion is None:
            lines.append(f"{head}: governance has not opened its promotion yet "
                         "(`triloop promotions list` shows it once it has)")
            continue
        where = candidate.get("promotion_status") or "open"
        if where == "open" and candidate.get("current_gate"):
            where = f"open at the {candidate['current_gate']} gate"
        lines.append(f"{head}: promotion {promotion}, {where}; "
                     f"console: {base}/promotions/{promotion}")
    return lines
