"""Readable tables and ``--json`` output for the ``ckptstore`` command.

Example::

    from ckptstore.cli.output import render_table

    print(render_table([{"uuid": "0b7c", "steps": 10}], [("uuid", "UUID"), ("steps", "Steps")]))
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import click

from ckptstore.masking import mask_value

Columns = Sequence[tuple[str, str]]


def jsonable(value: Any) -> Any:
    """``value`` with datetimes, sets and objects turned into JSON types."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [jsonable(v) for v in items]
    if isinstance(value, _dt.datetime | _dt.date):
        return value.isoformat()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "item"):  # numpy scalars
        try:
            return value.item()
        except Exception:  # noqa: BLE001
            pass
    return str(value)


#: The ``--json`` flag (into ``as_json``) of every verb that can print JSON for scripts.
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def emit_json(value: Any) -> None:
    """Print ``value`` as indented JSON on stdout, secrets masked (:mod:`ckptstore.masking`)."""
    click.echo(json.dumps(mask_value(jsonable(value)), indent=2))


def format_cell(value: Any) -> str:
    """One table cell: short and single-line."""
    if value is None:
        return "-"
    if isinstance(value, _dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={format_cell(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple | set):
        return ", ".join(format_cell(v) for v in value) or "-"
    return str(value).replace("\n", " ")


def render_table(rows: Iterable[Mapping[str, Any]], columns: Columns, max_width: int = 60) -> str:
    """A plain-text table with a header line; cells longer than ``max_width`` are cut."""
    rows = list(rows)
    cells = [[format_cell(row.get(key)) for key, _ in columns] for row in rows]
    cells = [
        [c if len(c) <= max_width else c[: max_width - 1] + "…" for c in line] for line in cells
    ]
    headers = [title for _, title in columns]
    widths = [max([len(h)] + [len(line[i]) for line in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(c) for c in cells]
    if not rows:
        out.append("(none)")
    return "\n".join(out)


def emit_rows(rows: list[dict[str, Any]], columns: Columns, as_json: bool) -> None:
    """A listing: JSON array with ``--json``, a table otherwise (secrets masked in both)."""
    rows = mask_value(rows)
    if as_json:
        emit_json(rows)
    else:
        click.echo(render_table(rows, columns))


def emit_record(record: Mapping[str, Any], as_json: bool, title: str | None = None) -> None:
    """One object: JSON with ``--json``, ``key: value`` lines otherwise (secrets masked)."""
    record = mask_value(record)
    if as_json:
        emit_json(record)
        return
    if title:
        click.echo(title)
    width = max((len(k) for k in record), default=0)
    for key, value in record.items():
        if isinstance(value, Mapping) and value:
            click.echo(f"{key.ljust(width)}:")
            for sub_key, sub_value in value.items():
                click.echo(f"  {sub_key}: {format_cell(sub_value)}")
        else:
            click.echo(f"{key.ljust(width)}: {format_cell(value)}")


def human_size(num_bytes: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    size = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{num_bytes} B"
