"""Determined calls that need a cluster: they exist, keep Determined's signature, and raise
:class:`~ckptstore.errors.NotSupported` saying what to use instead.

Example::

    class DistributedContext:
        from_horovod = not_supported_static(
            "DistributedContext.from_horovod", "DistributedContext.from_tf_config()", ("hvd",)
        )
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from ckptstore import errors

#: Attribute marking a callable that always raises NotSupported (read by the API-surface test).
MARKER = "__ckptstore_not_supported__"


def not_supported(name: str, instead: str) -> Callable[..., NoReturn]:
    """A function that raises NotSupported for Determined's ``name``, suggesting ``instead``.

    The returned function takes any arguments; wrap it where the exact signature must show.
    """

    def refuse(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise errors.NotSupported(
            f"{name} needs a Determined cluster, which ckptstore does not have. Use {instead} "
            "instead."
        )

    refuse.__name__ = name.rsplit(".", 1)[-1]
    refuse.__qualname__ = name
    refuse.__doc__ = f"Not supported without a Determined cluster: use {instead}."
    setattr(refuse, MARKER, instead)
    return refuse


__all__ = ["MARKER", "not_supported"]
