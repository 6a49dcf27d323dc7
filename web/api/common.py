"""What every API router shares: documented problem responses and small parameter types."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query

from web.problems import PROBLEM_MEDIA_TYPE, Problem

_MEANINGS = {
    400: "The body could not be parsed (not valid JSON)",
    401: "No valid bearer token or console session",
    403: "The policy refused (its reasons are in the problem), or a CSRF check failed",
    404: "No resource with that id",
    409: "The resource's state does not allow this (or the workflow refused it)",
    413: "The request body is larger than TRILOOP_MAX_BODY_BYTES",
    422: "The input does not match the schema or is not acceptable",
    429: "Too many production batches in flight; retry after Retry-After seconds",
    503: "Temporal or PostgreSQL is unreachable",
    504: "The loop's worker did not answer in time",
}


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        "model": Problem,
    }


ERRORS: dict[int | str, dict[str, Any]] = {
    status: _problem(text) for status, text in _MEANINGS.items()
}

Short = Annotated[str, Query(min_length=1, max_length=200)]

IdPrefix = Annotated[str, Query(min_length=1, max_length=64, pattern="^[0-9A-Za-z_-]+$",
                                description="only ids that start with this (CLIs resolve "
                                "a prefix to one id with it)")]
