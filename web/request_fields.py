"""Request fields that can never be stored: a NUL character anywhere is refused (422).

PostgreSQL text and JSONB cannot hold U+0000, so a NUL in an id or a filter used to
make the audit write fail, and the attempt left no audit row. The web service now
finds it first; the guard records the decision with each NUL written as the
visible text ``\\u0000`` and then refuses the request (``web.deps.Guard``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from fastapi import Request

NUL = "\x00"
NUL_SHOWN = "\\u0000"


def escape_nul(value: Any) -> Any:
    """``value`` with every NUL in its strings (keys too) written as ``\\u0000``."""
    if isinstance(value, str):
        return value.replace(NUL, NUL_SHOWN)
    if isinstance(value, dict):
        return {escape_nul(k): escape_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [escape_nul(v) for v in value]
    return value


async def field_with_nul(request: Request) -> str | None:
    """Where the first NUL of this request is (``path parameter run_id``), or None."""
    for name, value in request.path_params.items():
        if NUL in str(value):
            return f"path parameter {name}"
    for name, value in request.query_params.multi_items():
        if NUL in name or NUL in value:
            return f"query parameter {escape_nul(name)}"
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("application/json"):
        body = await request.body()
        if b"\\u0000" in body:  # JSON spells a NUL only this way (raw NUL is not JSON)
            try:
                document = json.loads(body)
            except ValueError:
                return None  # not JSON: refused by the schema check anyway
            return next(_nul_paths(document, "body"), None)
    elif content_type.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        form = await request.form()
        for name, value in form.multi_items():
            if NUL in name or (isinstance(value, str) and NUL in value):
                return f"form field {escape_nul(name)}"
    return None


def _nul_paths(value: Any, where: str) -> Iterator[str]:
    if isinstance(value, str):
        if NUL in value:
            yield f"field {where}"
    elif isinstance(value, dict):
        for key, item in value.items():
            if NUL in key:
                yield f"a key of field {where}"
            yield from _nul_paths(item, f"{where}.{escape_nul(key)}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _nul_paths(item, f"{where}[{index}]")
