"""``triloop env ...`` commands that need no services (the lead mounts ``env_app``).

``validate FILE`` prints every problem in a contract (with its line and dotted path)
and exits 1 if there is any; otherwise it prints the contract's id. A served contract's
service is asked for ``GET /info`` (``triloop.service_contact``): a wrong URL, a service
that is down or a verifier digest other than the pinned one is a problem too, unless
``--offline`` says to check the file alone. ``list`` shows the
built-in environments with their contract files and ids.
"""

from __future__ import annotations

from pathlib import Path

import typer

from execution_loop.environments import registry
from triloop.cli_output import OutputFormat, OutputOption, field, print_rows
from triloop.contracts import contract_id, fixture_hashes, parse_contract_text
from triloop.contracts import validate_contract_text as _validate
from triloop.service_contact import contact_problems

env_app = typer.Typer(help="Environment contracts.", no_args_is_help=True)


def validate_file(path: Path, *, offline: bool = False) -> tuple[list[str], str | None]:
    """Problems as printable lines, and the contract id when there are none.

    A served contract's service is contacted unless ``offline``.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [f"{path}: cannot read: {exc}"], None
    caps = registry.capabilities()
    problems = _validate(text, base_dir=path.parent, capabilities=caps)
    if problems:
        lines = [
            f"{path}:{p.line}: {p.path or '<document>'}: {p.message}"
            if p.line is not None
            else f"{path}: {p.path or '<document>'}: {p.message}"
            for p in problems
        ]
        return lines, None
    contract = parse_contract_text(text, base_dir=path.parent, capabilities=caps)
    served = [] if offline else contact_problems(contract)
    if served:
        return [f"{path}: {p.path}: {p.message}" for p in served], None
    return [], contract_id(contract, fixture_hashes(contract))


@env_app.command("validate")
def validate(
    file: Path = typer.Argument(..., help="Contract YAML file."),  # noqa: B008 (typer idiom)
    offline: bool = typer.Option(
        False, "--offline", help="Check the file only; do not ask a served contract's"
        " service for GET /info."),
) -> None:
    """Check a contract (and ask its service, if it names one); print every problem, or its
    id when valid."""
    lines, identity = validate_file(file, offline=offline)
    for line in lines:
        typer.echo(line, err=True)
    if identity is None:
        typer.echo(f"{len(lines)} problem(s) in {file}", err=True)
        raise typer.Exit(code=1)
    typer.echo(identity)


@env_app.command("list")
def list_builtin(output: OutputOption = OutputFormat.table) -> None:
    """The built-in environments (contract files and ids) and the installed plugins."""
    rows = []
    for name in registry.list_environments():
        if registry.is_builtin(name):
            rows.append({"name": name, "id": contract_id(registry.load_builtin_contract(name)),
                         "contract_file": str(registry.builtin_contract_path(name))})
        else:
            rows.append({"name": name, "id": "plugin",
                         "contract_file": str(registry.plugin_source(name))})
    print_rows(rows, (field("name", "name"), field("id", "id", is_id=True),
                      field("contract file", "contract_file")), output)
