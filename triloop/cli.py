"""The ``triloop`` command line.

This module is a composition root: besides its own commands (``dev``,
``migrate``, ``audit``) it mounts the command groups each service package
publishes, by module name, so the shared kernel never imports a loop.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from triloop.cli_output import (
    OutputFormat,
    OutputOption,
    echo,
    field,
    plain_error,
    print_json,
    print_rows,
)
from triloop.config import get_settings

app = typer.Typer(
    help="triloop: RL for LLM agents in three permissioned loops (execution, learning, "
    "governance).",
    no_args_is_help=True,
    add_completion=False,
    # An unexpected error is printed as a sentence by main(), not as a rich traceback.
    pretty_exceptions_enable=False,
)
dev_app = typer.Typer(help="Run the whole stack on this machine.", no_args_is_help=True)
audit_app = typer.Typer(help="The hash-chained audit log.", no_args_is_help=True)
app.add_typer(dev_app, name="dev")
app.add_typer(audit_app, name="audit")
console = Console()
err_console = Console(stderr=True)

# (group name, "module:attribute") published by each service package.
PLUGIN_GROUPS: tuple[tuple[str, str], ...] = (
    ("env", "execution_loop.cli:env_app"),
    ("env", "governance_loop.cli:env_app"),
    ("model", "learning_loop.cli:model_app"),
    # import/list/show through the API (the learning loop writes the checkpoint).
    ("model", "web.cli_models:model_app"),
    ("governance", "governance_loop.cli:governance_app"),
    ("users", "web.cli:users_app"),
    ("train", "web.cli_runs:train_app"),
    # `train mlflow-export`: a run's series into MLflow tracking, read through the API.
    ("train", "web.cli_mlflow:mlflow_app"),
    ("promotions", "web.cli_promotions:promotions_app"),
    ("deployments", "web.cli_deployments:deployments_app"),
    ("checkpoints", "web.cli_checkpoints:checkpoints_app"),
    # Game days are an operator's act: through the API with their token, never locally.
    ("faults", "web.cli:faults_app"),
    # An auditor's reads and `audit verify`, through the API, join the server-side `anchor`.
    ("audit", "web.cli_audit:audit_app"),
    ("trajectories", "web.cli_trajectories:trajectories_app"),
    # Webhooks are an operator's configuration: through the API with their token.
    ("webhooks", "web.cli_webhooks:webhooks_app"),
)
PLUGIN_COMMANDS: tuple[tuple[str, str], ...] = (
    ("rollback", "web.cli_deployments:rollback_command"),)


class PluginBroken(Exception):
    """A service package is installed but its commands cannot be loaded; says which and why."""


def _load(target: str, kind: type | None = None) -> object | None:
    """The object ``module:attribute`` names; None only if its package is not installed.

    A package that is installed but fails to import (a missing dependency, a syntax error)
    or does not publish the object is a fault to report, never a silently missing command.
    """
    module_name, attribute = target.split(":")
    if importlib.util.find_spec(module_name.split(".")[0]) is None:
        return None
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import error of a plugin: name the plugin, keep the cause
        raise PluginBroken(f"{target} failed to import: {type(exc).__name__}: {exc}") from exc
    found = getattr(module, attribute, None)
    if not (isinstance(found, kind) if kind is not None else callable(found)):
        expected = kind.__name__ if kind is not None else "a command function"
        raise PluginBroken(f"{target} is not {expected} (got {type(found).__name__})")
    return found


def mount_plugins(
    root: typer.Typer, groups: tuple[tuple[str, str], ...],
    commands: tuple[tuple[str, str], ...], mounted: dict[str, typer.Typer],
) -> list[str]:
    """Mount each installed package's command groups and commands on ``root``.

    Returns one line per plugin that could not be loaded; the others are mounted anyway,
    so one broken package does not take the whole command line down.
    """
    problems: list[str] = []
    for name, target in groups:
        try:
            group = _load(target, typer.Typer)
        except PluginBroken as broken:
            problems.append(f"the `{name}` commands are unavailable: {broken}")
            continue
        if not isinstance(group, typer.Typer):
            continue  # its package is not installed
        if name in mounted:
            # Two packages contribute to one group (``env``: validate from the
            # execution loop, register/diff/retire from governance).
            mounted[name].registered_commands.extend(group.registered_commands)
            continue
        mounted[name] = group
        root.add_typer(group, name=name)
    for name, target in commands:
        try:
            command = _load(target)
        except PluginBroken as broken:
            problems.append(f"the `{name}` command is unavailable: {broken}")
            continue
        if callable(command):
            root.command(name)(command)
    return problems


def _mount_plugins() -> None:
    for problem in mount_plugins(app, PLUGIN_GROUPS, PLUGIN_COMMANDS, {"audit": audit_app}):
        sys.stderr.write(f"warning: {problem}\n")


@dev_app.command("up")
def dev_up(
    no_workers: Annotated[
        bool, typer.Option("--no-workers", help="Start only PostgreSQL, Temporal and OPA.")
    ] = False,
) -> None:
    """Start PostgreSQL, Temporal, OPA, the three loop workers and the web app."""
    from triloop.devstack.processes import ServiceStartError
    from triloop.devstack.stack import up

    try:
        lines = up(get_settings(), with_workers=not no_workers)
    except ServiceStartError as error:
        err_console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from error
    for line in lines:
        console.print(line)


@dev_app.command("status")
def dev_status(output: OutputOption = OutputFormat.table) -> None:
    """Show each service, whether it runs, and its log file."""
    from triloop.devstack.stack import sandbox_line, status, urls, users_line

    rows = [{"service": name, "state": state, "log": log}
            for name, state, log in status(get_settings())]
    lines = [*urls(get_settings()), users_line(), sandbox_line(get_settings())]
    if output is OutputFormat.json:
        print_json({"services": rows, "urls": lines})
        return
    print_rows(rows, (field("service", "service"), field("state", "state"),
                      field("log", "log")), output)
    for line in lines:
        echo(line)


@dev_app.command("down")
def dev_down() -> None:
    """Stop what ``dev up`` started (by recorded pid)."""
    from triloop.devstack.stack import down

    stopped = down(get_settings())
    console.print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


@dev_app.command("logs")
def dev_logs(
    service: Annotated[str, typer.Argument(help="postgres, temporal, opa, web, *-worker")],
    lines: Annotated[int, typer.Option("-n", help="How many lines.")] = 50,
) -> None:
    """Print the end of one service's log."""
    from triloop.devstack.processes import tail
    from triloop.devstack.stack import log_path

    try:
        path = log_path(get_settings(), service)
    except ValueError as error:
        err_console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(2) from error
    console.print(f"== {path}")
    console.print(tail(path, lines), markup=False, highlight=False)


@app.command("migrate")
def migrate(
    downgrade_to: Annotated[
        str | None, typer.Option("--downgrade", help="Downgrade to this revision (e.g. base).")
    ] = None,
) -> None:
    """Upgrade the database to the latest schema (or downgrade)."""
    from triloop import migrate as migrations

    url = get_settings().owner_url()
    if downgrade_to:
        migrations.downgrade(url, downgrade_to)
        console.print(f"downgraded to {downgrade_to}")
    else:
        migrations.upgrade(url)
        console.print("database is at the latest revision")


@audit_app.command("anchor")
def audit_anchor(
    file: Annotated[Path | None, typer.Option(
        "--file", help="Append the anchor line to this file (kept outside the database).")
    ] = None,
) -> None:
    """Print (or append to --file) the signed head of the chain, to keep outside the database."""
    from sqlalchemy.exc import OperationalError

    from triloop.audit import chain_head
    from triloop.audit_anchor import ANCHOR_KEY, sign
    from triloop.db import role_engine
    from triloop.secrets import ensure_secret

    settings = get_settings()
    try:
        head = chain_head(role_engine(settings, "web"))
    except OperationalError as error:
        # Run outside the clone the database refuses (no password): say where this runs.
        err_console.print(
            "audit anchor signs the chain's head with the server's anchor key, so it runs on"
            " the server, in the clone `triloop dev up` started (or with TRILOOP_DATABASE_URL"
            " and the secrets folder of that deployment); the database said: "
            f"{' '.join(str(error.orig or error).split())}", markup=False, soft_wrap=True)
        raise typer.Exit(1) from error
    if head is None:
        err_console.print("the audit chain is empty: nothing to anchor yet")
        raise typer.Exit(1)
    line = sign(head[0], head[1], ensure_secret(settings.secrets, ANCHOR_KEY)).line()
    if file is not None:
        with file.open("a") as kept:
            kept.write(line + "\n")
        console.print(f"anchored seq {head[0]} in {file}")
    else:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def main() -> None:
    """Entry point of the ``triloop`` command.

    Anything a command did not turn into its own message ends as ``error: <message>`` and
    exit code 1, never a traceback or a class name; ``TRILOOP_DEBUG=1`` shows the traceback.
    """
    _mount_plugins()
    try:
        app(prog_name="triloop")
    except Exception as error:
        if os.environ.get("TRILOOP_DEBUG"):
            raise
        sys.stderr.write(f"error: {plain_error(error)}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
