"""Extract the Keras-facing public API of an installed ``determined`` (0.38.1) into JSON.

Run it with the Python of a side virtualenv that has the real wheel (never the project's venv)::

    python3 -m venv /tmp/detvenv && /tmp/detvenv/bin/pip install determined==0.38.1
    /tmp/detvenv/bin/python scripts/determined_api_snapshot.py > tests/compat/determined_0_38_1_api.json

Modules that import without TensorFlow (``determined``, ``determined.core``,
``determined.experimental``, ``determined.experimental.client``, ``determined.errors``) are read with ``inspect``.
``determined.keras`` needs ``tf.keras`` (Keras 2), which is not installable next to Keras 3, so
its source files are parsed with ``ast`` instead: the names its ``__init__.py`` imports, each
class's methods, properties and constructor, following base classes defined in Determined.

Standard library only: this file runs inside the side venv, never imports ckptstore.

Output shape (one entry per public name)::

    {"determined_version": "0.38.1",
     "modules": {"determined.core": {"init": {"kind": "function", "params": [...]}, ...}}}

A parameter is ``[name, kind, default]`` with kind one of ``posonly``, ``pos`` (positional or
keyword), ``*`` (var-positional), ``kw`` (keyword-only), ``**``; default is a normalized source
text (``DownloadMode.LocalWorkersShareDownload``, ``None``, ``'epoch'``) or null when required.
"""

from __future__ import annotations

import ast
import enum
import importlib
import inspect
import json
import os
import sys
import types
import warnings
from typing import Any

#: Modules read with inspect -> which of their public names to keep (None: every public name
#: whose object was defined in Determined, plus constants).
INSPECTED = (
    "determined",
    "determined.core",
    "determined.experimental",
    "determined.experimental.client",
    "determined.errors",
)
#: Modules read from source: module name -> file (relative to the determined package).
PARSED = {
    "determined.keras": "keras/__init__.py",
    "determined.keras.callbacks": "keras/callbacks.py",
}
#: Submodules listed as names of their parent (they are namespaces users reach through).
SUBMODULES = {
    "determined": ("core", "keras", "experimental", "errors"),
    "determined.keras": ("callbacks",),
    "determined.experimental": ("client",),
}
_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: "posonly",
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "pos",
    inspect.Parameter.VAR_POSITIONAL: "*",
    inspect.Parameter.KEYWORD_ONLY: "kw",
    inspect.Parameter.VAR_KEYWORD: "**",
}


# ---- inspect -------------------------------------------------------------------------------------
def default_text(value: Any) -> str | None:
    """A default value as comparable source text."""
    if value is inspect.Parameter.empty:
        return None
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, types.FunctionType):
        return "<lambda>" if value.__name__ == "<lambda>" else value.__name__
    return repr(value)


def _plain(value: Any) -> Any:
    """An enum member's value as JSON (some of Determined's enums alias generated enums)."""
    while isinstance(value, enum.Enum):
        value = value.value
    return value if isinstance(value, (str, int, float, bool)) or value is None else repr(value)


def params_of(func: Any, drop_self: bool) -> list[list[Any]] | None:
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    params = [[p.name, _KINDS[p.kind], default_text(p.default)] for p in sig.parameters.values()]
    if drop_self and params and params[0][0] in ("self", "cls"):
        params = params[1:]
    return params


def describe_member(cls: type, name: str) -> dict[str, Any] | None:
    static = inspect.getattr_static(cls, name)
    if isinstance(static, property):
        return {"kind": "property"}
    if isinstance(static, staticmethod):
        return {"kind": "staticmethod", "params": params_of(static.__func__, drop_self=False)}
    if isinstance(static, classmethod):
        return {"kind": "classmethod", "params": params_of(static.__func__, drop_self=True)}
    if inspect.isfunction(static):
        return {"kind": "method", "params": params_of(static, drop_self=True)}
    if isinstance(static, (str, int, float, bool)) or static is None:
        return {"kind": "attribute"}
    return None


def describe_class(cls: type) -> dict[str, Any]:
    if issubclass(cls, enum.Enum):
        return {"kind": "enum", "members": {m.name: _plain(m.value) for m in cls}}
    members: dict[str, Any] = {}
    for name in sorted(dir(cls)):
        if name.startswith("_"):
            continue
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        if owner is None or not owner.__module__.startswith("determined"):
            continue  # inherited from object, Exception, tf.keras, ...
        entry = describe_member(cls, name)
        if entry is not None:
            members[name] = entry
    for klass in reversed(cls.__mro__):
        init = vars(klass).get("__init__")
        if klass.__module__.startswith("determined") and inspect.isfunction(init):
            try:
                source = inspect.getsource(init)
            except (OSError, TypeError):
                continue
            for attr in instance_attributes(ast.parse(_dedent(source)).body[0]):
                members.setdefault(attr, {"kind": "attribute"})
    members = dict(sorted(members.items()))
    entry: dict[str, Any] = {"kind": "class", "members": members}
    if "__init__" in vars(cls) or any(
        "__init__" in vars(k) for k in cls.__mro__[1:] if k.__module__.startswith("determined")
    ):
        entry["init"] = params_of(cls.__init__, drop_self=True)
    if issubclass(cls, BaseException):
        entry["kind"] = "exception"
    return entry


def describe_object(obj: Any) -> dict[str, Any] | None:
    if inspect.isclass(obj):
        return describe_class(obj)
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return {"kind": "function", "params": params_of(obj, drop_self=False)}
    if isinstance(obj, (str, int, float, bool)):
        return {"kind": "constant", "value": obj}
    return None


def inspect_module(name: str) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = importlib.import_module(name)
    out: dict[str, Any] = {}
    for attr in sorted(dir(module)):
        if attr.startswith("_"):
            continue
        obj = getattr(module, attr)
        if isinstance(obj, types.ModuleType):
            continue
        defined_in = getattr(obj, "__module__", "") or ""
        is_constant = isinstance(obj, (str, int, float)) and attr.isupper()
        if not (defined_in.startswith("determined") or is_constant):
            continue  # typing names, stdlib helpers imported into the namespace
        entry = describe_object(obj)
        if entry is not None:
            out[attr] = entry
    for sub in SUBMODULES.get(name, ()):
        out[sub] = {"kind": "module"}
    return out


# ---- ast -----------------------------------------------------------------------------------------
def _dedent(source: str) -> str:
    import textwrap

    return textwrap.dedent(source)


def instance_attributes(init: ast.AST) -> list[str]:
    """Public ``self.<name> = ...`` targets of an ``__init__`` (Determined's ``context.env``)."""
    found: list[str] = []
    for node in ast.walk(init):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
                and not target.attr.startswith("_")
            ):
                found.append(target.attr)
    return found


def _default_source(node: ast.expr | None) -> str | None:
    return None if node is None else ast.unparse(node)


def ast_params(fn: ast.FunctionDef, drop_self: bool) -> list[list[Any]]:
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(
        a.defaults
    )
    params: list[list[Any]] = []
    for i, arg in enumerate(positional):
        kind = "posonly" if i < len(a.posonlyargs) else "pos"
        params.append([arg.arg, kind, _default_source(defaults[i])])
    if a.vararg:
        params.append([a.vararg.arg, "*", None])
    for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append([arg.arg, "kw", _default_source(default)])
    if a.kwarg:
        params.append([a.kwarg.arg, "**", None])
    if drop_self and params and params[0][0] in ("self", "cls"):
        params = params[1:]
    return params


class SourceIndex:
    """Classes and functions defined in the parsed files of the determined package."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.trees: dict[str, ast.Module] = {}

    def tree(self, module: str) -> ast.Module:
        if module not in self.trees:
            rel = module.partition(".")[2].replace(".", os.sep) or "__init__"
            path = os.path.join(self.root, rel + ".py")
            if not os.path.exists(path):
                path = os.path.join(self.root, rel, "__init__.py")
            with open(path, encoding="utf-8") as f:
                self.trees[module] = ast.parse(f.read())
        return self.trees[module]

    def definition(self, module: str, name: str) -> tuple[str, ast.AST] | None:
        """Where ``module.name`` is defined, following ``from x import name``."""
        for node in self.tree(module).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
                return module, node
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets
            ):
                return module, node
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("determined")
            ):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.definition(node.module, alias.name)
        return None

    def resolve_base(self, module: str, base: ast.expr) -> tuple[str, Any] | None:
        """A base class: ``("ast", (module, ClassDef))`` or ``("live", cls)`` for classes that
        import without TensorFlow (``det.TrialContext``), else None (``tf.keras.*``)."""
        text = ast.unparse(base)
        if text.startswith("det."):
            import determined

            return "live", getattr(determined, text[4:])
        head = text.split(".")[0]
        if "." not in text:
            found = self.definition(module, text)
            if found and isinstance(found[1], ast.ClassDef):
                return "ast", found
            return None
        target = self.imported_module(module, head)
        if target is not None:
            found = self.definition(target, text.split(".", 1)[1])
            if found and isinstance(found[1], ast.ClassDef):
                return "ast", found
        return None

    def imported_module(self, module: str, name: str) -> str | None:
        """The Determined module bound to ``name`` in ``module`` (``from determined.keras import
        callbacks``), None when it is bound to something else (``from tensorflow.keras import
        callbacks``)."""
        for node in self.tree(module).body:
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        if node.module.startswith("determined"):
                            return f"{node.module}.{alias.name}"
                        return None
        return None

    def class_members(self, module: str, node: ast.ClassDef) -> tuple[dict[str, Any], Any]:
        members: dict[str, Any] = {}
        init: Any = None
        for base in reversed(node.bases):
            resolved = self.resolve_base(module, base)
            if resolved is None:
                continue
            how, target = resolved
            if how == "live":
                described = describe_class(target)
                members.update(described.get("members", {}))
                init = described.get("init", init)
            else:
                base_members, base_init = self.class_members(*target)
                members.update(base_members)
                init = base_init if base_init is not None else init
        for item in node.body:
            if isinstance(item, ast.FunctionDef):
                decorators = {ast.unparse(d) for d in item.decorator_list}
                if item.name == "__init__":
                    init = ast_params(item, drop_self=True)
                    for attr in instance_attributes(item):
                        members.setdefault(attr, {"kind": "attribute"})
                elif item.name.startswith("_"):
                    continue
                elif "property" in decorators:
                    members[item.name] = {"kind": "property"}
                elif "staticmethod" in decorators:
                    members[item.name] = {"kind": "staticmethod", "params": ast_params(item, False)}
                elif "classmethod" in decorators:
                    members[item.name] = {"kind": "classmethod", "params": ast_params(item, True)}
                else:
                    members[item.name] = {"kind": "method", "params": ast_params(item, True)}
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                if not item.target.id.startswith("_"):
                    members[item.target.id] = {"kind": "attribute"}
        return members, init

    def describe(self, module: str, name: str) -> dict[str, Any] | None:
        found = self.definition(module, name)
        if found is None:
            return None
        where, node = found
        if isinstance(node, ast.FunctionDef):
            return {"kind": "function", "params": ast_params(node, drop_self=False)}
        if isinstance(node, ast.ClassDef):
            members, init = self.class_members(where, node)
            entry: dict[str, Any] = {"kind": "class", "members": dict(sorted(members.items()))}
            if init is not None:
                entry["init"] = init
            return entry
        return {"kind": "type alias"}


def parsed_module(index: SourceIndex, name: str, rel: str) -> dict[str, Any]:
    tree = index.tree(name if rel.endswith("__init__.py") else name)
    names: list[str] = []
    for node in tree.body:
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("determined")
        ):
            names += [a.asname or a.name for a in node.names]
        elif isinstance(node, ast.ClassDef):
            names.append(node.name)
    out: dict[str, Any] = {}
    for attr in sorted(set(names)):
        if attr.startswith("_") or attr in SUBMODULES.get(name, ()):
            continue
        entry = index.describe(name, attr)
        if entry is not None:
            out[attr] = entry
    for sub in SUBMODULES.get(name, ()):
        out[sub] = {"kind": "module"}
    return out


def main() -> int:
    import determined

    root = os.path.dirname(determined.__file__)
    modules: dict[str, Any] = {name: inspect_module(name) for name in INSPECTED}
    index = SourceIndex(root)
    for name, rel in PARSED.items():
        modules[name] = parsed_module(index, name, rel)
    snapshot = {
        "determined_version": determined.__version__,
        "how": "inspect for modules importable without TensorFlow; ast for determined.keras*",
        "modules": dict(sorted(modules.items())),
    }
    json.dump(snapshot, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
