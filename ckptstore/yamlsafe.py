"""Untrusted YAML read in bounded time and memory: a file over :data:`MAX_BYTES`, collections
nested deeper than :data:`MAX_DEPTH` or more than :data:`MAX_NODES` values (a YAML alias counted
each time it is used) raise :class:`~ckptstore.errors.InvalidConfig` before anything walks the
data recursively: deeper nesting overflows Python's stack, and aliases can make a 1 kB file
expand to billions of nodes.

Example::

    from ckptstore.yamlsafe import load_yaml

    raw = load_yaml("const.yaml", "experiment config", "examples/mnist_tfkeras_trial/const.yaml")
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from ckptstore import errors

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_NODES", "check_size", "load_yaml"]

MAX_DEPTH = 64
MAX_NODES = 200_000
#: A config file larger than this is not a config (Determined's are a few kB).
MAX_BYTES = 1 << 20


def check_size(raw: Any, where: str = "<config>", what: str = "experiment config") -> None:
    """Refuse ``raw`` nested deeper than :data:`MAX_DEPTH` or with more than :data:`MAX_NODES`
    values, counting a YAML alias each time it is used (an alias bomb stops here after
    ``MAX_NODES`` steps instead of exhausting memory later)."""
    level, depth, nodes = [raw], 0, 1
    while level:  # breadth first, one list per level: no recursion, few allocations
        below: list[Any] = []
        for node in level:
            if isinstance(node, dict):
                below.extend(node.values())
            elif isinstance(node, list | tuple):
                below.extend(node)
            if nodes + len(below) > MAX_NODES or (below and depth + 1 > MAX_DEPTH):
                shape = f"nested deeper than {MAX_DEPTH}" if depth + 1 > MAX_DEPTH else "too large"
                raise errors.InvalidConfig(
                    f"Invalid {what} at `{where}`: the config is {shape} (at most {MAX_DEPTH} "
                    f"levels and {MAX_NODES} values, YAML aliases counted each time they are "
                    f"used), received more than {nodes + len(below)} values down to depth "
                    f"{depth + 1}. Flatten it or move bulky data into a file the trial reads."
                )
        level, depth, nodes = below, depth + 1, nodes + len(below)


def _depth_ok(text: str) -> bool:
    """True when no collection in ``text`` nests deeper than :data:`MAX_DEPTH`, read from
    the YAML event stream (iterative), before PyYAML's recursive composer could overflow the
    stack. libyaml's parser when installed: the pure-Python scanner is quadratic in nesting."""
    import yaml

    depth = 0
    try:
        for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    return False
            elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
                depth -= 1
    except yaml.YAMLError as exc:
        if "nesting depth" in str(exc):  # libyaml's own limit (1000 levels)
            return False
        raise
    return True


#: Floats YAML 1.2 writes that YAML 1.1 (PyYAML) reads as strings: an exponent without a dot
#: (``2e-4``, ``1e5``) or without a sign (``1.0e5``). Determined read configs with ruamel.yaml
#: (YAML 1.2), so ``lr: 2e-4`` in its example configs is a float there and here.
_YAML12_FLOAT = re.compile(
    r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+|\.[0-9_]+[eE][-+]?[0-9]+)$"
)


@functools.cache
def _config_loader() -> Any:
    """PyYAML's safe loader (libyaml's when installed) that also reads YAML 1.2's floats and
    refuses a key written twice in one mapping (PyYAML keeps the last silently; Determined's
    reader, ruamel.yaml, refuses it too). Keys merged in with ``<<`` may be overridden."""
    import yaml

    class ConfigLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                    continue
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found the key {key!r} twice (keep one)",
                        key_node.start_mark,
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    ConfigLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789.")
    )
    return ConfigLoader


def load_yaml(path: str | Path, what: str, example: str) -> Any:
    """The YAML file at ``path`` (a ``what``, like ``example``) safely loaded and checked by
    :func:`check_size`; :class:`~ckptstore.errors.InvalidConfig` when it is missing, too large,
    too deep or not YAML. Floats YAML 1.2 writes without a dot (``2e-4``) are floats, as in
    Determined's reader; everything else is YAML 1.1 as PyYAML reads it."""
    import yaml

    path = Path(path)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise errors.InvalidConfig(
            f"Cannot read the {what} {str(path)!r}: {exc.strerror}. "
            f"Pass the path of a YAML file such as {example}."
        ) from None
    if len(data) > MAX_BYTES:
        raise errors.InvalidConfig(
            f"The {what} {str(path)!r} is larger than {MAX_BYTES} bytes; an {what} is a few "
            "kB. Move bulky data into a file the trial reads."
        )
    try:
        text = data.decode("utf-8")
        if not _depth_ok(text):
            raise errors.InvalidConfig(
                f"Invalid {what} at `<config>`: collections are nested deeper than {MAX_DEPTH} "
                f"levels, received {str(path)!r}. Flatten it."
            )
        raw = yaml.load(text, Loader=_config_loader())  # noqa: S506 - a safe loader
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise errors.InvalidConfig(
            f"The {what} {str(path)!r} is not valid YAML: {exc}. Fix the syntax."
        ) from None
    check_size(raw, "<config>", what)
    return raw
