"""Lifecycle hooks a team adds to its contract (``hooks:``) without editing triloop."""

from __future__ import annotations

from typing import Any

from execution_loop.hooks import HookRefusal

MAX_REPLY_CHARS = 200


def known_seeds_only(contract: Any, seed: int) -> None:
    """before_reset: this team's puzzles are defined for non-negative seeds only."""
    del contract
    if seed < 0:
        raise HookRefusal(f"seed {seed} is negative")


def short_replies(contract: Any, index: int, action: str, result: Any) -> dict[str, Any]:
    """after_step: refuse a reply longer than the team allows; note every reply's length."""
    del contract, result
    if len(action) > MAX_REPLY_CHARS:
        raise HookRefusal(f"reply {index} has {len(action)} characters (> {MAX_REPLY_CHARS})")
    return {"reply_chars": len(action)}


def episode_summary(contract: Any, summary: dict[str, Any]) -> dict[str, Any]:
    """after_episode: keep how many turns the episode took beside the verdict."""
    del contract
    return {"turns": summary["steps"]}
