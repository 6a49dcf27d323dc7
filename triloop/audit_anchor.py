"""Anchors of the audit chain kept outside the database, signed with a key it never holds.

The hash chain shows an edit or a gap to anyone who trusts the head; a database owner
who rewrites history can re-hash every later row and present a new, consistent head.
An anchor is one line an operator keeps elsewhere (a file, a ticket, a notebook):
``seq hash signature``, where the signature is HMAC-SHA256 of ``seq:hash`` under a key
kept in the secrets folder, not in the database. Verifying an anchor file checks each
line's signature and that the chain still holds that hash at that seq, so a rewritten
chain is caught at the first anchor it passed.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass

ANCHOR_KEY = "audit-anchor-key"


@dataclass(frozen=True)
class Anchor:
    """One kept head of the chain."""

    seq: int
    hash: str
    signature: str

    def line(self) -> str:
        """The line to keep: ``seq hash signature``."""
        return f"{self.seq} {self.hash} {self.signature}"


class AnchorError(ValueError):
    """An anchor file that cannot be read or whose line is not signed by the key."""


def sign(seq: int, chain_hash: str, key: str) -> Anchor:
    """The anchor of the chain at ``seq`` whose row hash is ``chain_hash``."""
    mac = hmac.new(key.encode(), f"{seq}:{chain_hash}".encode(), hashlib.sha256).hexdigest()
    return Anchor(seq, chain_hash, mac)


def parse(lines: Iterable[str], key: str) -> list[Anchor]:
    """Anchors from kept lines (blank lines and ``#`` comments skipped), signatures checked."""
    anchors = []
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        parts = text.split()
        if len(parts) != 3 or not parts[0].isdigit():
            raise AnchorError(f"line {number}: expected 'seq hash signature', got {text[:80]!r}")
        anchor = Anchor(int(parts[0]), parts[1], parts[2])
        if not hmac.compare_digest(sign(anchor.seq, anchor.hash, key).signature,
                                   anchor.signature):
            raise AnchorError(f"line {number}: the signature does not match (seq {anchor.seq});"
                              " the line was edited, or signed with another key")
        anchors.append(anchor)
    return anchors


def broken_anchors(anchors: Iterable[Anchor], stored: dict[int, str]) -> list[str]:
    """Anchors the chain no longer holds: its row at that seq is gone or hashes otherwise."""
    problems = []
    for anchor in anchors:
        found = stored.get(anchor.seq)
        if found is None:
            problems.append(f"seq {anchor.seq} was anchored but is no longer in the chain")
        elif found != anchor.hash:
            problems.append(f"seq {anchor.seq} hashed {anchor.hash[:16]}… when anchored, now"
                            f" {found[:16]}…: the chain was rewritten")
    return problems
