"""``triloop audit events|export|verify``: what an auditor reads and checks, through the API
with their token (so they work from any machine; ``audit anchor`` runs on the server)."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import httpx
import typer

from triloop.cli_output import (
    Column,
    OutputFormat,
    OutputOption,
    echo,
    fail,
    field,
    print_json,
    print_rows,
)
from web.audit_vocabulary import AuditAction, AuditKind
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


class ViewChoice(StrEnum):
    """One row per act, or every row as the chain holds it."""

    acts = "acts"
    chain = "chain"


KindOption = Annotated[AuditKind | None, typer.Option(
    "--kind", help="Resource kind, e.g. promotion.", case_sensitive=False)]
ActionOption = Annotated[AuditAction | None, typer.Option(
    "--action", help="Action, e.g. approve.", case_sensitive=False)]
ActorOption = Annotated[str | None, typer.Option("--actor", help="User or service.")]
PersonOption = Annotated[str | None, typer.Option(
    "--person", help="A person's acts, and the refusals a loop recorded about their decisions.")]
ViewOption = Annotated[ViewChoice, typer.Option(
    "--view", case_sensitive=False, help="acts: one row per act; chain: every row.")]
TrafficOption = Annotated[bool, typer.Option(
    "--traffic", help="Include production episodes (create trajectory).")]
DecisionOption = Annotated[DecisionChoice | None, typer.Option("--decision",
                                                                case_sensitive=False)]
SinceOption = Annotated[str | None, typer.Option("--since", help="ISO 8601, e.g. 2026-12-01.")]
UntilOption = Annotated[str | None, typer.Option("--until", help="ISO 8601 (exclusive).")]


def _filters(kind: AuditKind | None, actor: str | None, decision: DecisionChoice | None,
             since: str | None, until: str | None, *, action: AuditAction | None = None,
             person: str | None = None, view: ViewChoice = ViewChoice.acts,
             traffic: bool = False) -> dict[str, str]:
    pairs = (("kind", kind.value if kind else None), ("action", action.value if action else None),
             ("actor", actor), ("person", person),
             ("decision", decision.value if decision else None), ("since", since),
             ("until", until), ("view", view.value), ("traffic", "true" if traffic else None))
    return {k: v for k, v in pairs if v}


def _outcome(event: dict[str, Any]) -> str:
    """How the act ended: its outcome (with the status), denied or recorded."""
    if event.get("outcome"):
        return f"{event['outcome']} ({event['outcome_status']})"
    return {"deny": "denied", "record": "recorded"}.get(event["decision"], "allowed")


EVENT_COLUMNS = (
    field("seq", "seq"), field("at", "at"),
    Column("actor", lambda e: e["actor"].get("user") or e["actor"].get("service")),
    field("action", "action"), Column("kind", lambda e: e["resource"].get("kind")),
    Column("id", lambda e: e["resource"].get("id"), is_id=True),
    Column("outcome", _outcome), Column("reason", lambda e: e.get("reason") or ""),
)


@audit_app.command("events")
def audit_events(
    kind: KindOption = None, action: ActionOption = None, actor: ActorOption = None,
    person: PersonOption = None, decision: DecisionOption = None,
    since: SinceOption = None, until: UntilOption = None,
    view: ViewOption = ViewChoice.acts, traffic: TrafficOption = False,
    limit: Annotated[int, typer.Option("--limit", min=1, max=200)] = 50,
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """One row per act, newest first: how each ended and why a refusal was (auditors)."""
    query = urlencode({"limit": limit, **_filters(
        kind, actor, decision, since, until, action=action, person=person, view=view,
        traffic=traffic)})
    page = api_call("GET", f"/api/audit/events?{query}", token=token, api_url=api_url)
    print_rows(page["items"], EVENT_COLUMNS, output, json_data=page)


@audit_app.command("export")
def audit_export(
    format: Annotated[ExportChoice, typer.Option(  # noqa: A002 (the option's name)
        "--format", case_sensitive=False)] = ExportChoice.csv,
    out: Annotated[Path | None, typer.Option("--out", help="File (default: stdout).")] = None,
    kind: KindOption = None, action: ActionOption = None, actor: ActorOption = None,
    person: PersonOption = None, decision: DecisionOption = None,
    since: SinceOption = None, until: UntilOption = None,
    view: Annotated[ViewChoice, typer.Option("--view", case_sensitive=False, help=(
        "chain (default): every row, to check against the chain; acts: one per act."))
    ] = ViewChoice.chain,
    traffic: TrafficOption = False,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Export the filtered events (oldest first, at most 10,000) as CSV or JSON."""
    if not token:
        fail("no API token: pass --token or set TRILOOP_TOKEN", code=2)
    query = urlencode({"format": format.value, **_filters(
        kind, actor, decision, since, until, action=action, person=person, view=view,
        traffic=traffic or view is ViewChoice.chain)})
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


AnchorFile = Annotated[Path | None, typer.Option(
    "--anchor-file", help="File of kept anchors (one per line, from `triloop audit anchor`).")]


@audit_app.command("verify")
def audit_verify(
    anchor_file: AnchorFile = None, output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Walk the audit chain on the server and name the first broken row (auditors); with
    --anchor-file, also check that the chain still holds each kept anchor."""
    body: dict[str, Any] | None = None
    if anchor_file is not None:
        try:
            body = {"anchors": [line for line in anchor_file.read_text().splitlines()
                                if line.strip()]}
        except OSError as error:
            fail(f"cannot read the anchor file {anchor_file}: {error.strerror or error}")
    report = api_call("POST", "/api/audit/verify", token=token, api_url=api_url, body=body)
    if output is OutputFormat.json:
        print_json(report)
    elif report["ok"]:
        echo(f"audit chain verified: {report['checked']} events, no gap, no edit")
        if report.get("anchors_checked") is not None:
            echo(f"{report['anchors_checked']} anchor(s) still held by the chain")
    if not report["ok"]:
        if output is not OutputFormat.json:
            where = (f"at seq {report['broken_seq']}: " if report.get("broken_seq") is not None
                     else "")
            sys.stderr.write(f"audit chain broken {where}{report['problem']} "
                             f"({report['checked']} events verified before it)\n")
        raise typer.Exit(1)
