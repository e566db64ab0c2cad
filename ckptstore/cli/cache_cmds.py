"""``ckptstore cache ...``: the local restore cache (:mod:`ckptstore.checkpointing.cache`).

Example::

    $ ckptstore cache info --json
    $ ckptstore cache clear
"""

from __future__ import annotations

import dataclasses

import click

from ckptstore.cli.output import emit_json, emit_record, human_size, json_option


@click.group("cache")
def cache() -> None:
    """The local restore cache: files of checkpoints already loaded on this machine.

    \b
    Example:
      ckptstore cache info
      CKPTSTORE_CACHE_SIZE=20GB ckptstore checkpoint download 0b7c...
    """


@cache.command("info")
@json_option
def info_cmd(as_json: bool) -> None:
    """Where the cache is, its size and limit, entries and the hit rate of recent loads.

    \b
    Example:
      ckptstore cache info --json
    """
    from ckptstore.checkpointing.cache import RestoreCache, env_choice

    info = dataclasses.asdict(RestoreCache().info())
    choice = env_choice()
    info["enabled"] = "auto (on for remote storage)" if choice is None else choice
    if as_json:
        emit_json(info)
        return
    rate = info["hit_rate"]
    view = dict(
        info,
        size=human_size(info["size"]),
        limit=human_size(info["limit"]),
        hit_rate="-"
        if rate is None
        else f"{rate:.1%} of the bytes of the last {info['loads']} loads",
    )
    emit_record(view, False, title="Restore cache")


@cache.command("clear")
def clear_cmd() -> None:
    """Delete every entry (checkpoints in storage are not touched).

    \b
    Example:
      ckptstore cache clear
    """
    from ckptstore.checkpointing.cache import RestoreCache

    restore_cache = RestoreCache()
    freed = restore_cache.clear()
    click.echo(f"Cleared the restore cache at {restore_cache.root} ({human_size(freed)})")
