"""YAML that refuses a key given twice in one mapping (YAML forbids it; plain safe_load keeps the
last, so a config with `lr:` twice would silently train with the second). `load_config` reads
configs with `UniqueKeyLoader` and reports a `DuplicateKeyError` as file:line.
"""

from __future__ import annotations

import yaml

__all__ = ["UniqueKeyLoader", "DuplicateKeyError"]


class DuplicateKeyError(yaml.YAMLError):
    """A YAML mapping that holds one key twice (YAML forbids it; plain safe_load keeps the last)."""

    def __init__(self, key: str, line: int, first: int):
        super().__init__(f"duplicate key '{key}' at line {line} (first at line {first})")
        self.key, self.line, self.first = key, line, first


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping; merge keys (<<) still override."""

    def __init__(self, stream):
        super().__init__(stream)
        self._paths: dict = {}  # a nested mapping node -> the "section." prefix that names its keys

    def construct_mapping(self, node, deep=False):
        prefix = self._paths.get(node, "")
        seen: dict = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: SafeLoader reports it
                continue
            if first != key_node.start_mark.line + 1:
                raise DuplicateKeyError(f"{prefix}{key}", key_node.start_mark.line + 1, first)
            if isinstance(value_node, yaml.MappingNode):  # name nested keys section.key
                self._paths[value_node] = f"{prefix}{key}."
        return super().construct_mapping(node, deep=deep)
