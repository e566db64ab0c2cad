"""Determined calls that need a cluster (:func:`not_supported`) or data ckptstore's registry
does not keep (:func:`refuses`): they exist, keep Determined's signature, and raise
:class:`~ckptstore.errors.NotSupported` saying what to use instead. Shared by ``ckptstore.core``
and the SDK (``ckptstore.experimental``), so it sits beside ``errors.py``, below both.

Example::

    class DistributedContext:
        from_horovod = not_supported_static(
            "DistributedContext.from_horovod", "DistributedContext.from_tf_config()", ("hvd",)
        )
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from ckptstore import errors

#: Attribute marking a callable that always raises NotSupported (read by the API-surface test).
MARKER = "__ckptstore_not_supported__"

F = TypeVar("F", bound=Callable[..., Any])


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


def refuses(name: str, instead: str, why: str) -> Callable[[F], F]:
    """Decorator for a Determined call ckptstore has no data for (not a cluster matter): the
    decorated function keeps its signature (arguments are checked against it, and it shows in
    ``help()``) and its body is replaced by raising NotSupported with ``why`` and ``instead``.

    Example::

        @refuses("Experiment.archive", "exp.add_label('archived')", "the registry has no flag")
        def archive(self) -> None: ...
    """

    def wrap(func: F) -> F:
        signature = inspect.signature(func)

        @functools.wraps(func)
        def refuse(*args: Any, **kwargs: Any) -> NoReturn:
            signature.bind(*args, **kwargs)  # a wrong call is a TypeError, as in Determined
            raise errors.NotSupported(f"{name} is not supported: {why}. Use {instead} instead.")

        refuse.__doc__ = f"Not supported ({why}): use {instead}."
        setattr(refuse, MARKER, instead)
        return refuse  # type: ignore[return-value]

    return wrap


__all__ = ["MARKER", "not_supported", "refuses"]
