"""``triloop deployments list | show`` and ``triloop rollback``: what serves each alias,
since when and why, and moving an alias back (operators), through the web API with the
person's token.

``deployments show`` answers what an operator asks first when something looks wrong: which
checkpoint serves, since when, which move put it there and why (a promotion, a rollback,
the bootstrap), who did it, and where a rollback would go now.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

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
from web.cli_api import DEFAULT_API, ApiOption, TokenOption, api_call, quoted
from web.cli_checkpoints import resolve_checkpoint

deployments_app = typer.Typer(help="What each alias serves, since when and why; its rollback"
                                   " target and history.", no_args_is_help=True)

AliasArgument = Annotated[str, typer.Argument(help="Deployment alias.")]

DEPLOYMENT_COLUMNS = (
    field("alias", "alias"), field("serves", "checkpoint_id", is_id=True),
    field("since", "updated_at"), field("by", "updated_by"),
    Column("promotion", lambda d: d.get("promotion_id") or "", is_id=True),
    Column("rollback target", lambda d: d.get("rollback_target_id") or "none", is_id=True),
)
HISTORY_COLUMNS = (
    field("when", "created_at"), field("kind", "kind"),
    field("checkpoint", "checkpoint_id", is_id=True),
    Column("from", lambda h: h.get("previous_checkpoint_id") or "", is_id=True),
    field("by", "actor"), field("reason", "reason"),
)


@deployments_app.command("list")
def deployments_list(
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Every alias, the checkpoint it serves and its rollback target."""
    page = api_call("GET", f"/api/deployments?{urlencode({'limit': 200})}", token=token,
                    api_url=api_url)
    print_rows(page["items"], DEPLOYMENT_COLUMNS, output, json_data=page)


def serving_lines(detail: dict[str, Any]) -> list[str]:
    """What an alias serves, since when, why, and where a rollback would go, as sentences."""
    latest = (detail.get("history") or [None])[0]
    lines = [f"{detail['alias']} serves {detail['checkpoint_id']} since {detail['updated_at']}"]
    if latest is not None and latest["checkpoint_id"] == detail["checkpoint_id"]:
        why = f": {latest['reason']}" if latest.get("reason") else ""
        lines.append(f"  put there by {latest['actor']} ({latest['kind']}{why})")
    else:
        lines.append(f"  put there by {detail['updated_by']}")
    if detail.get("promotion_id"):
        lines.append(f"  through promotion {detail['promotion_id']}")
    target = detail.get("rollback_target_id")
    lines.append(f"  rollback target: {target}" if target else
                 "  rollback target: none (no earlier revision that was not rolled back)")
    return lines


@deployments_app.command("show")
def deployments_show(
    alias: AliasArgument = "production", output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """What an alias serves, since when and why, its rollback target and its latest moves."""
    detail = api_call("GET", f"/api/deployments/{quoted(alias)}", token=token, api_url=api_url)
    if output is OutputFormat.json:
        print_json(detail)
        return
    for line in serving_lines(detail):
        echo(line)
    if detail.get("history"):
        echo("history, newest first:")
        print_rows(detail["history"], HISTORY_COLUMNS, output)


def rollback_command(
    reason: Annotated[str | None, typer.Option(
        "--reason", help="Why (recorded in the audit log); not needed with --dry-run.")] = None,
    alias: Annotated[str, typer.Option("--alias", help="Deployment alias.")] = "production",
    to_revision: Annotated[int | None, typer.Option(
        "--to-revision", min=1, help="Return to this revision of the alias's history.")] = None,
    to_checkpoint: Annotated[str | None, typer.Option(
        "--to-checkpoint", help="Return to this checkpoint's latest revision (its id, a unique"
        " prefix of it, or its name).")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Show where the rollback would go; change nothing.")] = False,
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Roll an alias back to the last revision that was not rolled back (operators).

    A rolled-back checkpoint is never served again without a new promotion.
    """
    if to_revision is not None and to_checkpoint:
        fail("pass --to-revision or --to-checkpoint, not both", code=2)
    if to_checkpoint:
        to_checkpoint = resolve_checkpoint(to_checkpoint, token=token, api_url=api_url)
    if dry_run:
        query = urlencode({k: v for k, v in (("to_revision", to_revision),
                                             ("to_checkpoint_id", to_checkpoint)) if v})
        preview = api_call("GET", f"/api/deployments/{quoted(alias)}/rollback-preview"
                           + (f"?{query}" if query else ""), token=token, api_url=api_url)
        if output is OutputFormat.json:
            print_json(preview)
        else:
            _print_preview(preview)
        return
    if not reason or not reason.strip():
        fail("a rollback needs --reason (or use --dry-run)", code=2)
    body: dict[str, Any] = {"reason": reason}
    if to_revision is not None:
        body["to_revision"] = to_revision
    if to_checkpoint:
        body["to_checkpoint_id"] = to_checkpoint
    result = api_call("POST", f"/api/deployments/{quoted(alias)}/rollback", token=token,
                      api_url=api_url, body=body)
    if output is OutputFormat.json:
        print_json(result)
    else:
        echo(f"{result['alias']} rolled back from {result['previous_checkpoint_id']} to "
             f"{result['checkpoint_id']} (revision {result['target_revision']}), workflow "
             f"{result['workflow_id']}")


def _print_preview(preview: dict[str, Any]) -> None:
    target = preview["target"]
    echo(f"dry run: nothing changed. {preview['alias']} serves "
         f"{preview['current_checkpoint_id']}")
    echo(f"a rollback would return to revision {target['revision']}: checkpoint "
         f"{target['checkpoint_id']}, moved there by {target['actor']} "
         f"({target['kind']}: {target['reason']}) at {target['created_at']}")

    def state(r: dict[str, Any]) -> str:
        return ("serving" if r["serving"] else
                f"rolled back at {r['rolled_back_at']}" if r["rolled_back_at"] else
                "target" if r["revision"] == target["revision"] else "")

    print_rows(preview["history"], (
        field("revision", "revision"), field("checkpoint", "checkpoint_id", is_id=True),
        field("kind", "kind"), field("by", "actor"), field("reason", "reason"),
        Column("state", state)), OutputFormat.table)
