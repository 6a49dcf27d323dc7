"""``triloop checkpoints list | show | lineage``: checkpoints and where they came from,
through the web API with the person's token (as the console's Checkpoints and Lineage
pages show them).

A checkpoint is named by its name, its id (the sha256 of its weights) or a unique prefix of
the id; an ambiguous prefix lists the candidates.
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
    field,
    print_json,
    print_rows,
    progress,
)
from web.cli_api import DEFAULT_API, ApiOption, TokenOption, api_call, quoted, resolve_id

checkpoints_app = typer.Typer(help="Checkpoints and their lineage (the base, the runs, the"
                                   " environments, the promotions).", no_args_is_help=True)

CheckpointArgument = Annotated[str, typer.Argument(
    help="A checkpoint's name, id, or unique id prefix.")]

CHECKPOINT_COLUMNS = (
    field("id", "id", is_id=True), Column("name", lambda c: c.get("name") or ""),
    Column("run", lambda c: c.get("run_id") or "", is_id=True),
    Column("iteration", lambda c: "" if c.get("iteration") is None else str(c["iteration"])),
    Column("parent", lambda c: c.get("parent_id") or "", is_id=True),
    field("created by", "created_by"), field("created", "created_at"),
)


def resolve_checkpoint(ref: str, *, token: str | None, api_url: str) -> str:
    """The checkpoint ``ref`` names: by its name, else its id or a unique id prefix."""
    named = api_call("GET", f"/api/checkpoints?{urlencode({'name': ref, 'limit': 1})}",
                     token=token, api_url=api_url)
    if named["items"]:
        return str(named["items"][0]["id"])
    return resolve_id("checkpoints", ref, "checkpoint", token=token, api_url=api_url)


@checkpoints_app.command("list")
def checkpoints_list(
    run: Annotated[str | None, typer.Option(
        "--run", help="Only the checkpoints of this run (its id or a unique prefix).")] = None,
    bases: Annotated[bool, typer.Option(
        "--bases", help="Only bases: imported models and the directories runs started from.")
    ] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, max=200)] = 50,
    cursor: Annotated[str | None, typer.Option(
        "--cursor", help="The next page, as the previous page said.")] = None,
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Checkpoints, newest first: id, name, run and iteration, parent."""
    query: dict[str, Any] = {"limit": limit}
    if run is not None:
        query["run_id"] = resolve_id("runs", run, "training run", token=token, api_url=api_url)
    if bases:
        query["bases"] = "true"
    if cursor:
        query["cursor"] = cursor
    page = api_call("GET", f"/api/checkpoints?{urlencode(query)}", token=token,
                    api_url=api_url)
    print_rows(page["items"], CHECKPOINT_COLUMNS, output, json_data=page)
    if page.get("next_cursor") and output is not OutputFormat.json:
        progress(f"more: triloop checkpoints list --cursor {page['next_cursor']}")


def checkpoint_facts(checkpoint: dict[str, Any]) -> str:
    """Source, size and dtypes in one line."""
    count = checkpoint.get("parameter_count")
    size = f"{count:,} parameters" if isinstance(count, int) else "parameters not recorded"
    return (f"{checkpoint.get('source_kind') or 'trained'}, {size}, stored as"
            f" {checkpoint.get('dtype') or '?'} (source {checkpoint.get('source_dtype') or '?'})")


def show_checkpoint(checkpoint: dict[str, Any]) -> None:
    """One checkpoint as lines: name, facts, parent and run, digests, who made it."""
    title = f" ({checkpoint['name']})" if checkpoint.get("name") else ""
    echo(f"checkpoint {checkpoint['id']}{title}")
    echo(f"  {checkpoint_facts(checkpoint)}")
    if checkpoint.get("parent_id"):
        echo(f"  parent {checkpoint['parent_id']}, run {checkpoint.get('run_id')},"
             f" iteration {checkpoint.get('iteration')}")
    for label, key in (("tokenizer", "tokenizer_sha256"), ("model config", "model_config_sha256"),
                       ("chat template", "chat_template_sha256")):
        echo(f"  {label} sha256: {checkpoint.get(key) or 'none'}")
    echo(f"  created by {checkpoint['created_by']} at {checkpoint['created_at']};"
         f" artifact {checkpoint['artifact_uri']}")


@checkpoints_app.command("show")
def checkpoints_show(
    ref: CheckpointArgument, output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """One checkpoint: name, source, parameters, parent and run, digests."""
    checkpoint_id = resolve_checkpoint(ref, token=token, api_url=api_url)
    checkpoint = api_call("GET", f"/api/checkpoints/{quoted(checkpoint_id)}", token=token,
                          api_url=api_url)
    if output is OutputFormat.json:
        print_json(checkpoint)
    else:
        show_checkpoint(checkpoint)


def _node_line(node: dict[str, Any]) -> str:
    checkpoint, run = node["checkpoint"], node.get("run")
    made = "base" if not checkpoint.get("parent_id") else (
        f"iteration {checkpoint.get('iteration')} of run {run['id']} ({run['name']}, by"
        f" {run['submitted_by']})" if run else f"iteration {checkpoint.get('iteration')}")
    envs = ", ".join(f"{e['environment_name']}@{e['version']}" for e in node["environments"])
    serving = f"; serves {', '.join(node['aliases'])}" if node.get("aliases") else ""
    name = f" ({checkpoint['name']})" if checkpoint.get("name") else ""
    return (f"{checkpoint['id']}{name}: {made}" + (f"; trained on {envs}" if envs else "")
            + serving)


@checkpoints_app.command("lineage")
def checkpoints_lineage(
    ref: CheckpointArgument, output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """The chain from the base model to this checkpoint, with each run and environment, the
    promotions of the checkpoint and the eval sets that judged it."""
    checkpoint_id = resolve_checkpoint(ref, token=token, api_url=api_url)
    found = api_call("GET", f"/api/checkpoints/{quoted(checkpoint_id)}/lineage", token=token,
                     api_url=api_url)
    if output is OutputFormat.json:
        print_json(found)
        return
    echo(f"lineage of {found['candidate_id']} (base model {found['base_model']}), base first:")
    if found.get("truncated"):
        echo("  ... (older ancestors not shown)")
    for node in found["chain"]:
        echo(f"  {_node_line(node)}")
    for promotion in found.get("promotions") or []:
        at = f" at {promotion['current_gate']}" if promotion.get("current_gate") else ""
        echo(f"  promotion {promotion['id']}: {promotion['status']}{at}")
    for eval_set in found.get("eval_sets") or []:
        echo(f"  judged on eval set {eval_set['name']} v{eval_set['version']} ({eval_set['id']})")
