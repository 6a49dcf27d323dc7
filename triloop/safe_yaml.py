"""YAML from people and clients, parsed without aliases (no "billion laughs").

PyYAML's safe loader still expands aliases: 524 bytes of nested ``*a`` references
become billions of values once anything walks the result. Run configs and
environment contracts never need aliases, so an alias (or a merge key, which is
one) is refused with its line, and a document nested too deeply for the parser
is refused instead of crashing it.
"""

from __future__ import annotations

from typing import Any

import yaml

ALIAS_REFUSED = (
    "YAML aliases are not accepted (*{anchor}): write the value out in full; an alias can "
    "expand a few hundred bytes into billions of values"
)


class YamlAliasRefused(yaml.MarkedYAMLError):
    """The document uses an alias; ``problem_mark`` says where."""


class YamlTooDeep(yaml.YAMLError):
    """The document nests deeper than the parser can follow."""


class _NoAliasLoader(yaml.SafeLoader):
    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise YamlAliasRefused(
                problem=ALIAS_REFUSED.format(anchor=event.anchor), problem_mark=event.start_mark
            )
        node: yaml.Node | None = super().compose_node(parent, index)
        return node


def compose_and_load(text: str) -> tuple[yaml.Node | None, Any]:
    """Parse once: the node tree (for line numbers) and the plain data; None when empty."""
    loader = _NoAliasLoader(text)
    try:
        node = loader.get_single_node()
        data = None if node is None else loader.construct_document(node)
    except RecursionError as exc:
        raise YamlTooDeep("the document is nested too deeply to parse") from exc
    finally:
        loader.dispose()
    return node, data


def safe_load(text: str) -> Any:
    """The plain data of a YAML document (aliases refused)."""
    return compose_and_load(text)[1]
