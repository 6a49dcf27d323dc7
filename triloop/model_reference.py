"""A Markdown reference of the environment contract and RUN.yaml, generated from the models.

``python -m triloop.model_reference > docs/reference.md`` writes it; a unit test fails
when the file and the models disagree, so the reference cannot drift. Each field's
text is its ``Field(description=...)``, else the comment the model's source puts on
the field (trailing, or the comment lines just above it), which is where our models
state units.
"""

from __future__ import annotations

import inspect
import re
import sys
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from triloop.contracts import EnvironmentContract
from triloop.run_config import RunConfig

_FIELD = re.compile(r"^    ([a-z_][a-z0-9_]*)\s*:\s*[^#]*?(?:#\s*(.*))?$")
_COMMENT = re.compile(r"^    #\s?(.*)$")


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """Each field's comment in the class source: trailing, else the lines just above it."""
    found: dict[str, str] = {}
    above: list[str] = []
    for line in inspect.getsource(model).splitlines():
        comment = _COMMENT.match(line)
        if comment:
            above.append(comment.group(1).strip())
            continue
        field = _FIELD.match(line)
        if field and field.group(1) in model.model_fields:
            text = field.group(2) or " ".join(above)
            if text:
                found[field.group(1)] = text.strip()
        above = []
    return found


def _sections(annotation: Any) -> list[type[BaseModel]]:
    """The models inside a field's type (``X``, ``X | None``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += _sections(arg)
    return found


def _type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return annotation.__name__
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return "None" if annotation is None else str(annotation)


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    else:
        value = info.default
    if value is PydanticUndefined:
        return ""
    if isinstance(value, BaseModel):
        return "(section defaults)"
    return f"`{value!r}`"


def _constraints(info: FieldInfo) -> str:
    shown = []
    for item in info.metadata:
        for name in ("gt", "ge", "lt", "le", "min_length", "max_length", "pattern"):
            value = getattr(item, name, None)
            if value is not None:
                shown.append(f"{name} {value}")
    return ", ".join(shown)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def section_table(model: type[BaseModel], path: str) -> tuple[list[str], list[tuple[str, Any]]]:
    """One section's Markdown table, and its nested sections to describe after it."""
    comments = field_comments(model)
    doc = inspect.getdoc(model) or ""
    lines = [f"### `{path}`", "", doc, "",
             "| field | type | default | constraints | meaning |",
             "| --- | --- | --- | --- | --- |"]
    nested: list[tuple[str, Any]] = []
    for name, info in model.model_fields.items():
        meaning = info.description or comments.get(name, "")
        lines.append(f"| `{name}` | {_cell(_type_name(info.annotation))} | "
                     f"{_cell(_default(info))} | {_cell(_constraints(info))} | "
                     f"{_cell(meaning)} |")
        for section in _sections(info.annotation):
            nested.append((f"{path}.{name}", section))
    return lines + [""], nested


def reference(model: type[BaseModel], root: str) -> list[str]:
    """Every section of a model, breadth first."""
    out: list[str] = []
    queue: list[tuple[str, Any]] = [(root, model)]
    seen: set[str] = set()
    while queue:
        path, section = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        lines, nested = section_table(section, path)
        out += lines
        queue += nested
    return out


def render() -> str:
    """The whole reference document."""
    lines = [
        "# Reference: environment contracts and RUN.yaml",
        "",
        "Generated from the pydantic models by `python -m triloop.model_reference`; do not",
        "edit by hand (`tests/unit/test_model_reference.py` fails when it is stale).",
        "",
        "## Environment contract (`contract.yaml`, `triloop.contracts.EnvironmentContract`)",
        "",
        "Unknown keys are refused; values are strictly typed. `triloop env validate FILE`",
        "reports every problem as `file:line: path: message`.",
        "",
        *reference(EnvironmentContract, "contract"),
        "## Training run (`RUN.yaml`, `triloop.run_config.RunConfig`)",
        "",
        "Submitted with `triloop train submit RUN.yaml` or `POST /api/runs`. Only `name`,",
        "`model` and `rollout` are required.",
        "",
        *reference(RunConfig, "run"),
    ]
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    """Print the reference (Markdown) to stdout."""
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
