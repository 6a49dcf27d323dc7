"""How every ``triloop`` command prints, so that scripts can rely on it.

- ``--output json`` prints the API's own JSON, nothing else, on stdout.
- ``--output table`` (the default) prints a table on a terminal, with ids cut to a
  prefix that ``show`` and friends accept. When stdout is not a terminal it prints
  tab-separated lines instead: a header, then one line per row, with full ids and
  no wrapping at 80 columns, so ``cut``, ``awk`` and ``grep`` work.
- Errors are one plain sentence on stderr (``error: ...``) and a non-zero exit code;
  progress goes to stderr too, so it never mixes with what a script parses.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

# A prefix this long is almost always unique among ids; `show` resolves it.
SHORT_ID_CHARS = 12


class OutputFormat(StrEnum):
    """What a listing or show command prints."""

    table = "table"
    json = "json"


OutputOption = Annotated[
    OutputFormat,
    typer.Option("--output", "-o", case_sensitive=False,
                 help="table (tab-separated with full ids when piped) or json."),
]


def stdout_is_terminal() -> bool:
    """True when a person is reading stdout, not a pipe or a file."""
    return sys.stdout.isatty()


def out() -> Console:
    """A console for stdout that never wraps lines when piped."""
    return Console(soft_wrap=not stdout_is_terminal(), highlight=False)


def display_id(value: str | None) -> str:
    """An id as a table shows it: a prefix on a terminal, in full otherwise."""
    if value is None:
        return ""
    if stdout_is_terminal() and len(value) > SHORT_ID_CHARS:
        return value[:SHORT_ID_CHARS]
    return value


@dataclass(frozen=True)
class Column:
    """One table column: its header and how to get the cell from a row."""

    header: str
    cell: Callable[[dict[str, Any]], Any]
    is_id: bool = False

    def text(self, row: dict[str, Any]) -> str:
        """The cell as text (ids shortened on a terminal only)."""
        value = self.cell(row)
        if value is None:
            return ""
        return display_id(str(value)) if self.is_id else str(value)


def field(header: str, key: str, *, is_id: bool = False) -> Column:
    """A column that shows ``row[key]``."""
    return Column(header, lambda row: row.get(key), is_id)


def print_json(data: Any) -> None:
    """The data as JSON on stdout (what ``--output json`` prints)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def print_rows(rows: Iterable[dict[str, Any]], columns: Sequence[Column],
               output: OutputFormat, *, json_data: Any = None) -> None:
    """Rows as JSON, a terminal table, or tab-separated lines when piped."""
    rows = list(rows)
    if output is OutputFormat.json:
        print_json(rows if json_data is None else json_data)
        return
    if not stdout_is_terminal():
        lines = ["\t".join(c.header for c in columns)]
        lines += ["\t".join(_one_line(c.text(row)) for c in columns) for row in rows]
        sys.stdout.write("\n".join(lines) + "\n")
        return
    table = Table(*(c.header for c in columns))
    for row in rows:
        table.add_row(*(c.text(row) for c in columns))
    out().print(table)


def _one_line(text: str) -> str:
    return text.replace("\t", " ").replace("\n", " ")


def echo(text: str) -> None:
    """A line of plain text on stdout (no markup, no wrapping when piped)."""
    out().print(text, markup=False)


def progress(text: str) -> None:
    """A progress line on stderr, so stdout stays what a script parses."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def fail(message: str, *, code: int = 1) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    sys.stderr.write(f"error: {message}\n")
    raise typer.Exit(code)


def plain_error(error: BaseException) -> str:
    """An exception as a sentence a person can act on: its message, never its class name."""
    text = str(error).strip()
    if text:
        return text
    return "the command failed without a message; run it again with TRILOOP_DEBUG=1"


def pick_one(ref: str, ids: Sequence[str], noun: str) -> str:
    """The one id that ``ref`` names, exactly or as a unique prefix; else a plain error
    (an ambiguous prefix lists its candidates: ``triloop.id_prefix``)."""
    from triloop.id_prefix import match_prefix, unmatched_message

    found = match_prefix(ref, ids)
    if found.id is None:
        fail(unmatched_message(found, noun))
    return found.id
