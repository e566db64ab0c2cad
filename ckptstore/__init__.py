"""ckptstore: Keras 3 checkpoints on any storage, with a registry and exact resume.

Drop-in for Determined's Keras API: ``import ckptstore as det``. Heavy submodules
(``core``, ``keras`` and anything importing TensorFlow) load lazily on first attribute access,
so storage-only use and the CLI do not pay for importing TensorFlow.

Example::

    import ckptstore as det

    with det.core.init(storage="s3://bucket/ckpts") as core_context:
        ...
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ckptstore import _deprecated, errors

_deprecated.install()

__version__ = "0.1.0"

#: Determined's ``det.LOG_FORMAT`` (``logging.basicConfig(format=det.LOG_FORMAT)``), same text.
LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"

_LAZY_MODULES = {
    "core",
    "keras",
    "registry",
    "checkpointing",
    "storage_backends",
    "keras_io",
    "experiment",
    "import_determined",
    "experimental",
}
_LAZY_ATTRS: dict[str, tuple[str, str | None]] = {
    "load_checkpoint_model": ("ckptstore.keras_io.loading._loaders", "load_checkpoint_model"),
    "get_trial_info": ("ckptstore.core", "get_trial_info"),
    "get_cluster_info": ("ckptstore.core", "get_trial_info"),
    "ClusterInfo": ("ckptstore.core", "ClusterInfo"),
    "TrialInfo": ("ckptstore.core", "TrialInfo"),
    "InvalidHP": ("ckptstore.errors", "InvalidHP"),
    # `from ckptstore import signing`: checkpoint signatures (the format rule lives in checkpointing)
    "signing": ("ckptstore.checkpointing.signing", None),
}

if TYPE_CHECKING:  # pragma: no cover
    from ckptstore import core, keras  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        module = importlib.import_module(f"ckptstore.{name}")
        globals()[name] = module
        return module
    if name in _LAZY_ATTRS:
        module_name, attr = _LAZY_ATTRS[name]
        module = importlib.import_module(module_name)
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ckptstore' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY_MODULES | set(_LAZY_ATTRS))


__all__ = ["errors", "LOG_FORMAT", "__version__", *sorted(_LAZY_MODULES), *sorted(_LAZY_ATTRS)]
