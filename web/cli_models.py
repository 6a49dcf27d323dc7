"""``triloop model import | list | show``: base models through the web API, with one's token.

Mounted into the ``model`` group beside the learning loop's local ``init-tiny``. An import
is the learning loop's work (it writes checkpoints): the command asks the API to start it,
follows it with one progress line per stage on stderr, and prints the checkpoint id. Exit
codes: 0 imported, 1 refused or failed (the problem named), 4 ``--timeout`` passed first.
A checkpoint is named by its name, its id, or a unique prefix of the id.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import typer

from triloop.cli_output import (
    OutputFormat,
    OutputOption,
    echo,
    fail,
    field,
    print_json,
    print_rows,
    progress,
)
from web.cli_api import DEFAULT_API, ApiOption, TokenOption, api_call, quoted
from web.cli_checkpoints import checkpoint_facts, checkpoints_show

model_app = typer.Typer(help="Policy model checkpoints.", no_args_is_help=True)
EXIT_TIMEOUT = 4

BASE_COLUMNS = (field("id", "id", is_id=True), field("name", "name"),
                field("source", "source_kind"), field("parameters", "parameter_count"),
                field("source dtype", "source_dtype"), field("dtype", "dtype"),
                field("created", "created_at"))


def wait_for_import(name: str, *, token: str | None, api_url: str, timeout_s: float,
                    poll_s: float) -> dict[str, Any]:
    """Follow an import to its end, a line per new stage on stderr; its final status."""
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
    last = ""
    while True:
        status: dict[str, Any] = api_call("GET", f"/api/model-imports/{quoted(name)}",
                                          token=token, api_url=api_url)
        shown = status["status"] if status["status"] != "running" else status.get("stage") or ""
        if shown != last:
            progress(f"import {name}: {shown}")
            last = shown
        if status["status"] != "running":
            return status
        if deadline is not None and time.monotonic() >= deadline:
            progress(f"import {name}: still {shown} after {timeout_s:g} s; stopped waiting"
                     f" (`triloop model show {name}` once it is done)")
            raise typer.Exit(EXIT_TIMEOUT)
        time.sleep(poll_s)


@model_app.command("import")
def model_import(
    path: Annotated[Path | None, typer.Argument(
        help="A Hugging Face model directory or a .gguf file, as the learning worker sees"
             " it (a relative path is made absolute here).")] = None,
    example: Annotated[str | None, typer.Option(
        "--example", help="Import an example model shipped as a package: smollm2.")] = None,
    name: Annotated[str | None, typer.Option(
        "--name", help="Unique name for RUN.yaml's model.base (default: the folder's, the"
                       " file's or the example's name).")] = None,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=0, help="Give up waiting after this many seconds (exit 4); 0: never.")
    ] = 0,
    poll_interval: Annotated[float, typer.Option("--poll-interval", min=0.05)] = 2.0,
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Import a pretrained model as a base checkpoint; prints its id."""
    if (path is None) == (example is None):
        fail("give a model PATH or --example NAME (not both)", code=2)
    body: dict[str, Any] = ({"example": example} if example is not None
                            else {"source": str(path.absolute()) if path else ""})
    if name is not None:
        body["name"] = name
    started = api_call("POST", "/api/model-imports", token=token, api_url=api_url, body=body)
    status = wait_for_import(started["name"], token=token, api_url=api_url,
                             timeout_s=timeout, poll_s=poll_interval)
    if status["status"] == "failed":
        reasons = [r for r in status.get("reasons") or [] if r != status.get("problem")]
        fail("\n".join([f"import {started['name']} failed: {status.get('problem')}",
                        *(f"  - {r}" for r in reasons)]))
    if output is OutputFormat.json:
        print_json(status)
        return
    checkpoint = status["checkpoint"]
    echo(f"imported {checkpoint['name']}: checkpoint {checkpoint['id']}")
    echo(f"  {checkpoint_facts(checkpoint)}")


@model_app.command("list")
def model_list(
    limit: Annotated[int, typer.Option("--limit", min=1, max=200)] = 50,
    cursor: Annotated[str | None, typer.Option(
        "--cursor", help="The next page, as the previous page said.")] = None,
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Base models (imported, or registered from a run's model directory), newest first."""
    query = {"bases": "true", "limit": limit, **({"cursor": cursor} if cursor else {})}
    page = api_call("GET", f"/api/checkpoints?{urlencode(query)}", token=token,
                    api_url=api_url)
    print_rows(page["items"], BASE_COLUMNS, output, json_data=page)
    if page.get("next_cursor") and output is not OutputFormat.json:
        progress(f"more: triloop model list --cursor {page['next_cursor']}")


@model_app.command("show")
def model_show(
    ref: Annotated[str, typer.Argument(help="A checkpoint's name, id, or unique id prefix.")],
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """One checkpoint: name, source, parameters, dtypes and the digests it is served with
    (as `triloop checkpoints show`)."""
    checkpoints_show(ref, output=output, token=token, api_url=api_url)
