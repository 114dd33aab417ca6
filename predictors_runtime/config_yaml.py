"""Reading a cortex.yaml safely, before its schema (`config.py`) looks at it.

An API host reads this file for anyone who can deploy, so the reader refuses what PyYAML's safe
loader would accept: duplicate keys (silently overwritten), aliases that expand exponentially
(the "billion laughs"), nesting deeper than Python's recursion limit, integers too long to print.
"""

from __future__ import annotations

from typing import Any

import yaml

from foundation.errors import ConfigError

# Limits on reading a cortex.yaml, which an API host parses for anyone who can deploy: without
# them a small file could hold a worker for minutes (aliases expanding exponentially, the
# "billion laughs") or crash it (nesting deeper than Python's recursion limit).
MAX_CONFIG_BYTES = 1024 * 1024
MAX_YAML_DEPTH = 64
# Nodes that aliases (`*name`) may add to the document once expanded, beyond the nodes written.
MAX_YAML_ALIAS_EXPANSION = 100_000
# Characters of one integer (Python refuses to print integers of more than 4300 digits).
MAX_YAML_INT_CHARS = 100


class _YamlLimit(yaml.YAMLError):
    """A document over one of the reading limits; `problem_mark` says where, when known."""

    def __init__(self, problem: str, mark: Any = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


def _expansion(root: yaml.Node) -> tuple[int, int, int]:
    """(nodes written, nodes once aliases are expanded, depth once expanded) of a composed document.

    Aliases make the node graph a DAG (or a cycle, for an anchor used inside itself), so sizes
    are summed with one visit per node, without recursion.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            children = _children(node)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            continue
        if key in size:
            continue
        if key in on_path:
            raise _YamlLimit("an alias refers to a node that contains it (a recursive structure)", node.start_mark)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in size)
    return len(size), size[id(root)], depth[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses duplicate keys, which PyYAML would silently overwrite, and
    documents over the reading limits (nesting depth, alias expansion, integer length)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        # PyYAML composes recursively: refuse deep nesting before Python's own limit is reached.
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _YamlLimit(f"nested deeper than the limit of {MAX_YAML_DEPTH} levels",
                                 self.peek_event().start_mark)  # type: ignore[no-untyped-call]
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: Any) -> Any:
        written, expanded, depth = _expansion(node)
        if expanded - written > MAX_YAML_ALIAS_EXPANSION:
            raise _YamlLimit(
                f"aliases expand the document by more than the limit of {MAX_YAML_ALIAS_EXPANSION} "
                "nodes (anchors used too many times over)", node.start_mark,
            )
        if depth > MAX_YAML_DEPTH:
            raise _YamlLimit(f"aliases nest the document deeper than the limit of {MAX_YAML_DEPTH} levels",
                             node.start_mark)
        return super().construct_document(node)

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as e:  # e.g. a date such as 2001-02-30
            raise yaml.constructor.ConstructorError(None, None, f"invalid value: {e}", node.start_mark) from e


def _construct_int(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> Any:
    if len(node.value) > MAX_YAML_INT_CHARS:
        raise _YamlLimit(f"an integer longer than the limit of {MAX_YAML_INT_CHARS} characters", node.start_mark)
    return loader.construct_yaml_int(node)


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *defaults` merges a mapping in; `construct_mapping` resolves it
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, (str, int, float, bool)):
            continue  # unhashable keys are left to the normal constructor to reject
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def read_api_list(text: str, source: str) -> list[Any]:
    """The APIs of a cortex.yaml, as plain data (one mapping alone is a list of one): a file over
    a limit, with a duplicate key or not a list of APIs is a `ConfigError` naming where."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{source}: {size} bytes, over the limit of {MAX_CONFIG_BYTES} bytes for an API configuration"
        )
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{source}: {where}invalid YAML: {problem}") from e
    if data is None:
        raise ConfigError(f"{source}: the file is empty, expected a list of APIs")
    if isinstance(data, dict):
        return [data]
    if not isinstance(data, list):
        raise ConfigError(f"{source}: expected a list of APIs (got {type(data).__name__})")
    if not data:
        raise ConfigError(f"{source}: the list of APIs is empty")
    return data
