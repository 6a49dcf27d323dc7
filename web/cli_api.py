"""How the ``triloop`` CLI talks to the web API: one request helper that turns a problem
document into a plain sentence on stderr, and the id-prefix resolution every id argument
uses (runs, promotions, checkpoints, role grants: through each list's ``id_prefix``)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote, urlencode

import httpx
import typer

from triloop.cli_output import fail, pick_one
from triloop.id_prefix import MAX_CANDIDATES

TokenOption = Annotated[
    str | None, typer.Option("--token", envvar="TRILOOP_TOKEN", help="API token.")
]
ApiOption = Annotated[
    str, typer.Option("--api-url", envvar="TRILOOP_API_URL", help="Base URL of the web API.")
]
DEFAULT_API = "http://127.0.0.1:8000"


def api_call(
    method: str, path: str, *, token: str | None, api_url: str, body: Any = None
) -> Any:
    """Call the API; on any error print it as a sentence and exit 1 (2 without a token)."""
    if not token:
        fail("no API token: pass --token or set TRILOOP_TOKEN", code=2)
    try:
        response = httpx.request(
            method, api_url.rstrip("/") + path, json=body, timeout=120,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
        )
    except httpx.HTTPError as error:
        fail(f"cannot reach the API at {api_url}: {error or 'no answer'}")
    if response.status_code >= 400:
        fail(problem_sentence(response))
    return response.json()


def problem_sentence(response: httpx.Response) -> str:
    """A problem document as one message: its detail, the status, then each reason."""
    try:
        problem = response.json()
    except ValueError:
        return f"the API answered {response.status_code}: {response.text[:500]}"
    if not isinstance(problem, dict):
        return f"the API answered {response.status_code}"
    title = problem.get("title") or ""
    text = f"{problem.get('detail') or title} ({response.status_code} {title})".strip()
    reasons = [str(r) for r in problem.get("reasons") or []]
    return "\n".join([text, *(f"  - {r}" for r in reasons)])


def resolve_id(collection: str, ref: str, noun: str, *, token: str | None,
               api_url: str) -> str:
    """The one id of ``/api/<collection>`` that ``ref`` is or starts; else a plain error
    naming the candidates (``triloop.id_prefix``: the rule every id argument follows)."""
    query = urlencode({"id_prefix": ref, "limit": MAX_CANDIDATES + 1})
    page = api_call("GET", f"/api/{collection}?{query}", token=token, api_url=api_url)
    return pick_one(ref, [item["id"] for item in page["items"]], noun)


def quoted(value: str) -> str:
    """A path segment, escaped."""
    return quote(value, safe="")
