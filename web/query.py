"""Query-string integers as strict as their schema: digits only, optionally signed with '-'.

FastAPI reads ``?after=`` leniently (``1.0``, ``+1``, `` 1``, ``1_000`` all became 1),
so a value the OpenAPI schema calls invalid was accepted. These types refuse it with
a 422 that says what an integer looks like.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BeforeValidator

_INTEGER = re.compile(r"-?[0-9]+")


def plain_integer(value: Any) -> Any:
    """Let only ``-?[0-9]+`` text through to int parsing; other types are left to pydantic."""
    if isinstance(value, str) and not _INTEGER.fullmatch(value):
        raise ValueError("expected an integer written with digits only, e.g. 3 or -1")
    return value


# Put after ``Query(...)``: ``Annotated[int, Query(ge=1), DIGITS_ONLY]`` (also ``int | None``);
# placed before it, pydantic can no longer document the bounds as minimum/maximum.
DIGITS_ONLY = BeforeValidator(plain_integer)
