"""MkDocs hooks (mkdocs.yml ``hooks:``): reference pages generated from the code at build time.

- ``reference/config.md``: every key of the experiment config, from
  ``ckptstore.experiment.config_json_schema()`` (the pydantic models the loader validates with).
- ``reference/errors.md``: every class of ``ckptstore.errors`` with its base, its exit code
  (``ckptstore.cli.errors.exit_code_for``) and its docstring.
- The CLI page (``reference/cli.md``) is rendered by the ``mkdocs-click`` extension from the click
  command tree; ``on_config`` imports the lazily loaded sub-commands first so it sees all of them.

Nothing here is hand-written about the API: a renamed key, error or command changes the page.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

import click
import griffe
from mkdocs.structure.files import File, Files

CONFIG_PAGE = "reference/config.md"
ERRORS_PAGE = "reference/errors.md"


def on_config(config: Any) -> Any:
    from ckptstore.cli.main import cli

    _load_all_commands(cli, click.Context(cli, info_name="ckptstore"))
    return config


def _load_all_commands(group: click.Command, ctx: click.Context) -> None:
    # LazyGroup imports a sub-command on get_command(); mkdocs-click reads `.commands`.
    if isinstance(group, click.Group):
        for name in group.list_commands(ctx):
            sub = group.get_command(ctx, name)
            if sub is not None:
                _load_all_commands(sub, click.Context(sub, parent=ctx, info_name=name))


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, CONFIG_PAGE, content=config_page()))
    files.append(File.generated(config, ERRORS_PAGE, content=errors_page()))
    return files


# ---- experiment config ------------------------------------------------------------------------
def _type_of(spec: dict[str, Any]) -> str:
    if "$ref" in spec:
        name = spec["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    for key in ("anyOf", "oneOf"):
        if key in spec:
            parts = [_type_of(s) for s in spec[key] if s.get("type") != "null"]
            return " or ".join(dict.fromkeys(parts)) or "null"
    kind = spec.get("type", "any")
    if kind == "array":
        return f"list of {_type_of(spec.get('items', {}))}"
    if kind == "object" and "patternProperties" in spec:
        inner = next(iter(spec["patternProperties"].values()))
        return f"mapping of name to {_type_of(inner)}"
    if "enum" in spec:
        return " \\| ".join(f"`{v}`" for v in spec["enum"])
    if "const" in spec:
        return f"`{spec['const']}`"
    bounds = [f"≥ {spec['minimum']}"] if "minimum" in spec else []
    return " ".join([kind, *bounds])


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _object_table(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", ()))
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, spec in schema.get("properties", {}).items():
        default = "required" if key in required else f"`{json.dumps(spec.get('default'))}`"
        lines.append(
            f"| `{key}` | {_cell(_type_of(spec))} | {_cell(default)} | "
            f"{_cell(spec.get('description', ''))} |"
        )
    return lines


def config_page() -> str:
    from ckptstore.experiment import config_json_schema

    schema = config_json_schema()
    out = [
        "# Experiment config",
        "",
        "Generated at build time from `ckptstore.experiment.config_json_schema()` (the same",
        "schema `ckptstore experiment schema` prints). Keys are Determined 0.38's; keys that only",
        "mean something on a cluster are accepted and named in one warning, an unknown key is an",
        "error with a did-you-mean (see [Coming from Determined](../determined-compat.md)).",
        "",
        "## Top level",
        "",
        _cell(schema.get("description", "")),
        "",
        *_object_table(schema),
    ]
    for name, sub in schema.get("$defs", {}).items():
        out += ["", f"## {name}", "", _cell(sub.get("description", ""))]
        if "properties" in sub:
            out += ["", *_object_table(sub)]
        elif any(k in sub for k in ("anyOf", "oneOf")):
            out += ["", f"One of: {_type_of(sub)}."]
    out += [
        "",
        "## The whole schema",
        "",
        "```json",
        json.dumps(schema, indent=2),
        "```",
        "",
    ]
    return "\n".join(out)


# ---- errors and exit codes --------------------------------------------------------------------
def errors_page() -> str:
    from ckptstore import errors
    from ckptstore.cli.errors import EXIT_CODES_HELP, exit_code_for

    out = [
        "# Errors and exit codes",
        "",
        "Generated at build time from `ckptstore.errors` and `ckptstore.cli.errors`. Every",
        "deliberate error is a subclass of `CkptstoreError`; its message says what was wrong,",
        "ends with the value received and what to do. The `ckptstore` command maps each to an",
        "exit code:",
        "",
        "```text",
        EXIT_CODES_HELP.replace("\b\n", "").rstrip(),
        "```",
        "",
        "| error | subclass of | CLI exit code | meaning |",
        "|---|---|---|---|",
    ]
    for name in errors.__all__:
        cls = getattr(errors, name)
        base = cls.__mro__[1].__name__
        code = exit_code_for(cls.__new__(cls))
        doc = " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())
        out.append(f"| `{name}` | `{base}` | {code} | {_cell(doc)} |")
    return "\n".join(out) + "\n"


# ---- docstrings -------------------------------------------------------------------------------
_ROLE = re.compile(r":(?:py:)?(?:class|mod|meth|func|data|attr|exc|obj|const):`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def sphinx_to_markdown(text: str) -> str:
    """The project's docstrings use reST markup (``x``, :class:`X`, ``Example::`` blocks);
    mkdocstrings renders Markdown. Roles become code spans, literals single backticks, and a
    paragraph ending in ``::`` introduces a fenced code block of its indented lines."""
    text = _ROLE.sub(
        lambda m: f"`{m.group(1).rsplit('.', 1)[-1] if '~' in m.group(0) else m.group(1)}`", text
    )
    text = _LITERAL.sub(r"`\1`", text)
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.rstrip().endswith("::"):
            out.append(line)
            i += 1
            continue
        head = line.rstrip()[:-2].rstrip()
        out.append(head + (":" if head and not head.endswith(":") else ""))
        base = len(line) - len(line.lstrip())
        i += 1
        block: list[str] = []
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > base
        ):
            block.append(lines[i])
            i += 1
        while block and not block[-1].strip():
            block.pop()
        body = [b for b in block if b.strip()]
        indent = min((len(b) - len(b.lstrip()) for b in body), default=0)
        pad = " " * base
        out += [
            "",
            pad + "```python",
            *[pad + b[indent:] if b.strip() else "" for b in block],
            pad + "```",
            "",
        ]
    return "\n".join(out)


class SphinxToMarkdown(griffe.Extension):
    """Griffe extension (mkdocs.yml, mkdocstrings ``extensions``): reST docstrings to Markdown."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = sphinx_to_markdown(obj.docstring.value)
