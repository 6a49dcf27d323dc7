"""``triloop webhooks list|create|disable|deliveries``: through the API with the person's
token, so the policy refuses here exactly what it refuses there (operators configure,
operators and auditors read)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

import typer

from triloop.cli_output import Column, OutputFormat, OutputOption, echo, field, print_rows
from triloop.notifications.events import EventKind
from web.cli_api import DEFAULT_API, ApiOption, TokenOption, api_call, quoted

webhooks_app = typer.Typer(
    help="Webhooks (operators): promotions waiting for a person, failed gates, rollbacks, "
    "alarms and runs ending, POSTed signed to a URL. Through the API, authorized and audited.",
    no_args_is_help=True)

LIST_COLUMNS = (
    field("id", "id"), field("url", "url"),
    Column("events", lambda w: ", ".join(w["events"])), field("by", "created_by"),
    Column("disabled", lambda w: w["disabled_at"] or ""),
)
DELIVERY_COLUMNS = (
    field("id", "id"), field("event", "event"), field("status", "status"),
    field("attempts", "attempts"), Column("last", lambda d: d["last_error"] or str(
        d["last_status_code"] or "")), field("summary", "summary"),
)


@webhooks_app.command("list")
def webhooks_list(
    include_disabled: Annotated[bool, typer.Option("--all", help="Disabled ones too.")] = False,
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Webhooks events are sent to (never their secrets)."""
    query = urlencode({"include_disabled": "true"}) if include_disabled else ""
    rows = api_call("GET", "/api/webhooks" + (f"?{query}" if query else ""), token=token,
                    api_url=api_url)
    print_rows(rows, LIST_COLUMNS, output, json_data=rows)


@webhooks_app.command("create")
def webhooks_create(
    url: Annotated[str, typer.Argument(help="http(s) URL the events are POSTed to.")],
    events: Annotated[list[EventKind] | None, typer.Option(
        "--event", case_sensitive=False, help="A kind it receives (repeat); default: all.")
    ] = None,
    secret: Annotated[str | None, typer.Option(
        help="Shared secret (24+ characters); default: one is generated and printed once.")
    ] = None,
    description: Annotated[str, typer.Option(help="What it is for.")] = "",
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Send events to a URL, signed with a shared secret (operators; audited)."""
    body: dict[str, object] = {"url": url, "description": description}
    if events:
        body["events"] = [e.value for e in events]
    if secret is not None:
        body["secret"] = secret
    made = api_call("POST", "/api/webhooks", token=token, api_url=api_url, body=body)
    echo(f"webhook {made['id']} sends {', '.join(made['events'])} to {made['url']}")
    echo(f"secret (shown once): {made['secret']}")
    echo("each request is signed: Triloop-Signature = v1=<hex HMAC-SHA256(secret, "
         "Triloop-Timestamp + '.' + body)>")


@webhooks_app.command("disable")
def webhooks_disable(
    webhook_id: Annotated[str, typer.Argument(help="The webhook's id (wh-...).")],
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Stop sending to a webhook (operators; audited); its deliveries stay on record."""
    gone = api_call("DELETE", f"/api/webhooks/{quoted(webhook_id)}", token=token,
                    api_url=api_url)
    echo(f"webhook {gone['id']} disabled by {gone['disabled_by']}")


@webhooks_app.command("deliveries")
def webhooks_deliveries(
    webhook_id: Annotated[str, typer.Argument(help="The webhook's id (wh-...).")],
    limit: Annotated[int, typer.Option("--limit", min=1, max=200)] = 50,
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """A webhook's deliveries, newest first, and how each went."""
    rows = api_call("GET", f"/api/webhooks/{quoted(webhook_id)}/deliveries?"
                    + urlencode({"limit": limit}), token=token, api_url=api_url)
    print_rows(rows, DELIVERY_COLUMNS, output, json_data=rows)
