"""``triloop audit events|export``: what an auditor reads, through the API with their token.

(``audit verify`` and ``audit anchor`` run on the server against the database itself.)
"""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import httpx
import typer

from triloop.cli_output import Column, OutputFormat, OutputOption, fail, field, print_rows
from web.cli_api import DEFAULT_API, ApiOption, TokenOption, api_call, problem_sentence

audit_app = typer.Typer(help="The audit log.", no_args_is_help=True)


class DecisionChoice(StrEnum):
    """What an audit event records."""

    allow = "allow"
    deny = "deny"
    record = "record"


class ExportChoice(StrEnum):
    """The export's format."""

    csv = "csv"
    json = "json"


KindOption = Annotated[str | None, typer.Option("--kind", help="Resource kind, e.g. promotion.")]
ActorOption = Annotated[str | None, typer.Option("--actor", help="User or service.")]
DecisionOption = Annotated[DecisionChoice | None, typer.Option("--decision",
                                                                case_sensitive=False)]
SinceOption = Annotated[str | None, typer.Option("--since", help="ISO 8601, e.g. 2026-12-01.")]
UntilOption = Annotated[str | None, typer.Option("--until", help="ISO 8601 (exclusive).")]


def _filters(kind: str | None, actor: str | None, decision: DecisionChoice | None,
             since: str | None, until: str | None) -> dict[str, str]:
    pairs = (("kind", kind), ("actor", actor), ("decision", decision.value if decision else None),
             ("since", since), ("until", until))
    return {k: v for k, v in pairs if v}


def _outcome(event: dict[str, Any]) -> str:
    if not event.get("outcome"):
        return ""
    return f"{event['outcome']} ({event['outcome_status']})"


EVENT_COLUMNS = (
    field("seq", "seq"), field("at", "at"),
    Column("actor", lambda e: e["actor"].get("user") or e["actor"].get("service")),
    field("action", "action"), Column("kind", lambda e: e["resource"].get("kind")),
    Column("id", lambda e: e["resource"].get("id"), is_id=True),
    field("decision", "decision"), Column("outcome", _outcome),
)


@audit_app.command("events")
def audit_events(
    kind: KindOption = None, actor: ActorOption = None, decision: DecisionOption = None,
    since: SinceOption = None, until: UntilOption = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=200)] = 50,
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Decisions, newest first, each allowed action with how it ended (auditors)."""
    query = urlencode({"limit": limit, **_filters(kind, actor, decision, since, until)})
    page = api_call("GET", f"/api/audit/events?{query}", token=token, api_url=api_url)
    print_rows(page["items"], EVENT_COLUMNS, output, json_data=page)


@audit_app.command("export")
def audit_export(
    format: Annotated[ExportChoice, typer.Option(  # noqa: A002 (the option's name)
        "--format", case_sensitive=False)] = ExportChoice.csv,
    out: Annotated[Path | None, typer.Option("--out", help="File (default: stdout).")] = None,
    kind: KindOption = None, actor: ActorOption = None, decision: DecisionOption = None,
    since: SinceOption = None, until: UntilOption = None,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Export the filtered events (oldest first, at most 10,000) as CSV or JSON."""
    if not token:
        fail("no API token: pass --token or set TRILOOP_TOKEN", code=2)
    query = urlencode({"format": format.value, **_filters(kind, actor, decision, since, until)})
    try:
        response = httpx.request("GET", f"{api_url.rstrip('/')}/api/audit/events/export?{query}",
                                 headers={"Authorization": f"Bearer {token}"}, timeout=120)
    except httpx.HTTPError as error:
        fail(f"cannot reach the API at {api_url}: {error or 'no answer'}")
    if response.status_code >= 400:
        fail(problem_sentence(response))
    if out is None:
        sys.stdout.write(response.text)
    else:
        out.write_text(response.text, encoding="utf-8")
        sys.stderr.write(f"wrote {out}\n")
