"""The one rule for code a checkpoint names: a checkpoint never decides which code runs.

A Keras model config (a ``.keras`` archive's ``config.json``, Keras 2's ``model_config.json``)
names the Python module of every custom layer, loss or activation. Importing such a module runs
its import-time code, so a checkpoint naming ``this`` prints the Zen of Python and one naming
``ensurepip.__main__`` installs pip (Keras 3.9+ closed the same hole in its own loader,
CVE-2025-1550; Keras 2's ``tf_keras`` still imports any module a config names). Every loader
and exporter calls :func:`check_code_refs` on the config before Keras sees it. A name passes when:

- its module is Keras's own (``keras``, ``tf_keras``, ``keras_hub``, ...) or ``builtins``;
- it names no module, or ``__main__`` (nothing is imported: Keras finds it among the caller's
  registered objects or not at all);
- the caller handed it over: its name is a key of ``custom_objects``, or it is registered in
  this process (``@keras.saving.register_keras_serializable`` in code the caller imported);
- its module is in the caller's ``modules`` allow-list (or under a package there): those are
  imported before loading, because the caller said so;
- its module is one this process already imported and the module itself defines it (a class
  with ``from_config``, or a Python function): a TFKerasTrial's custom layer in the trial's own
  module, a layer in the caller's ``__main__``-like helper module. Using it imports nothing and
  runs no import-time code; a module not imported yet is still refused. Only the module's own
  namespace is read (never its ``__getattr__``, which could import), and a name the module
  merely re-exports (``os.system``) does not count.

Anything else raises :class:`~ckptstore.errors.UntrustedCode` naming every refused module and
class, before anything is imported or deserialized.

Example::

    from ckptstore.keras_io.saving._code_refs import check_code_refs

    to_import = check_code_refs(config_json, what="ckpt/model.keras", modules=["mylayers"])
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ckptstore import errors
from ckptstore.checkpointing.format import MAX_MANIFEST_BYTES
from ckptstore.checkpointing.jsonfiles import load_json

#: Packages whose classes Keras itself resolves: Keras's own family and Python's builtins
#: (Keras records built-in activations such as ``relu`` under ``builtins``).
KERAS_PACKAGES = frozenset({"keras", "tf_keras", "keras_hub", "keras_cv", "keras_nlp", "builtins"})


@dataclasses.dataclass(frozen=True, order=True)
class CodeRef:
    """One ``(module, class)`` pair a model config names."""

    module: str
    name: str
    registered_name: str | None = None

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


def named_code(config: Any) -> list[CodeRef]:
    """Every non-Keras ``(module, class)`` a decoded model config names, sorted, once each."""
    found: set[CodeRef] = set()
    stack = [config]
    while stack:  # iterative: a hostile config may nest deeper than the recursion limit
        node = stack.pop()
        if isinstance(node, dict):
            module = node.get("module")
            # A class or function reference has both keys; a Lambda's config names the module
            # of its function's globals only, which Keras looks up in sys.modules, never imports.
            if "class_name" in node and isinstance(module, str) and module not in ("", "__main__"):
                if module.split(".", 1)[0] not in KERAS_PACKAGES:
                    registered = node.get("registered_name")
                    found.add(
                        CodeRef(
                            module,
                            str(node.get("class_name")),
                            registered if isinstance(registered, str) else None,
                        )
                    )
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return sorted(found)


def _handed_over(ref: CodeRef, custom_objects: Mapping[str, Any]) -> bool:
    """Whether the caller handed ``ref`` over: a ``custom_objects`` key, or registered in this
    process. Keras looks both up by the registered name (the class name when there is none)
    before it would import the module, so nothing is imported."""
    name = ref.registered_name or ref.name
    if name in custom_objects:
        return True
    for keras_name in ("keras", "tf_keras"):
        keras = sys.modules.get(keras_name)  # only a Keras the process already imported
        lookup = getattr(getattr(keras, "saving", None), "get_registered_object", None)
        if lookup is not None and lookup(name) is not None:
            return True
    return False


def _imported_object(ref: CodeRef) -> Any:
    """The class or function ``ref`` names when a module this process already imported defines
    it (using it imports nothing), else None."""
    module = sys.modules.get(ref.module)
    if module is None:
        return None
    # Keras records a function as class_name "function" with its name as registered_name
    name = ref.registered_name if ref.name == "function" and ref.registered_name else ref.name
    found = vars(module).get(name.rsplit(">", 1)[-1])
    if getattr(found, "__module__", None) != ref.module:
        return None
    if isinstance(found, type):
        return found if callable(getattr(found, "from_config", None)) else None
    return found if inspect.isfunction(found) else None


def _already_imported(ref: CodeRef) -> bool:
    return _imported_object(ref) is not None


def imported_objects(config: str | bytes | Mapping[str, Any]) -> dict[str, Any]:
    """``custom_objects`` for the classes and functions ``config`` names that modules this
    process already imported define: Keras 3 imports only its own modules, so it finds them
    only when handed over (keys: the name Keras looks them up by)."""
    if isinstance(config, (str, bytes)):
        config = json.loads(config)
    found = {}
    for ref in named_code(config):
        obj = _imported_object(ref)
        if obj is not None:
            found[ref.registered_name or ref.name] = obj
    return found


def _allowed(module: str, modules: Iterable[str]) -> bool:
    return any(module == m or module.startswith(m + ".") for m in modules)


def check_code_refs(
    config: str | bytes | Mapping[str, Any],
    *,
    what: str,
    modules: Sequence[str] = (),
    custom_objects: Mapping[str, Any] | None = None,
) -> list[str]:
    """The allow-listed modules ``config`` names (to import before loading); raises
    :class:`~ckptstore.errors.UntrustedCode` for any other non-Keras module it names that the
    caller did not hand over (see the module docstring). ``what`` names the file in errors."""
    if isinstance(config, (str, bytes)):
        # Bounded size and depth (a config nested 100,000 deep is a typed error, not a
        # RecursionError); InvalidCheckpoint names the file.
        config = load_json(config, f"The model config in {what}", MAX_MANIFEST_BYTES)
    refs = named_code(config)
    objects = custom_objects or {}
    refused = [
        r
        for r in refs
        if not _allowed(r.module, modules)
        and not _handed_over(r, objects)
        and not _already_imported(r)
    ]
    if refused:
        listed = ", ".join(f"class {r.name!r} of module {r.module!r}" for r in refused)
        names = sorted({r.module for r in refused})
        raise errors.UntrustedCode(
            f"The model config in {what} names code that ckptstore does not import on a "
            "checkpoint's word (importing a module runs its code). If you trust it, import "
            f"and register it yourself, pass custom_objects={{{refused[0].registered_name or refused[0].name!r}: TheClass}}, "
            f"or allow the modules with modules={names!r} (CLI: "
            + " ".join(f"--module {n}" for n in names)
            + f"). Received: {listed}."
        )
    return sorted({r.module for r in refs if _allowed(r.module, modules)})


def import_allowed(names: Sequence[str], what: str) -> None:
    """Import the allow-listed modules that define a model's custom layers (they register
    them); :class:`~ckptstore.errors.ModelLoadError` when one does not import."""
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise errors.ModelLoadError(
                f"Cannot import module {name!r}, which defines layers of the model in {what}: "
                f"{exc}. Make it importable (PYTHONPATH) where the model is loaded. Received: "
                f"modules=[{name!r}]."
            ) from exc


__all__ = [
    "KERAS_PACKAGES",
    "CodeRef",
    "check_code_refs",
    "import_allowed",
    "imported_objects",
    "named_code",
]
