"""Compare ckptstore's public names and signatures with Determined 0.38.1's (from the snapshot).

``determined_0_38_1_api.json`` beside this file is extracted from the real wheel by
``scripts/determined_api_snapshot.py`` (run in a side venv); nothing here needs Determined.
Every Determined name ``determined.X.name`` is looked up as ``ckptstore.X.name`` and given a
status, best first:

- ``same``: exists, same parameters in the same order, same kinds and defaults;
- ``compatible``: every call Determined accepts is accepted (extra optional parameters, or a
  different default; the notes say which);
- ``not supported``: exists and raises ``ckptstore.errors.NotSupported`` naming what to use;
- ``out of scope``: not Keras-facing (the notes say why);
- ``different``: exists but a Determined call would fail (order, a missing parameter);
- ``missing``.

Regenerate the table after changing the API::

    PYTHONPATH=$PWD .venv/bin/python -m tests.compat.api_surface --write

``tests/compat/test_api_surface.py`` fails when a row's status gets worse than the committed
``docs/determined-compat.md`` says.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import importlib.util
import inspect
import json
import pathlib
import re
import sys
import types
from collections.abc import Iterator
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
SNAPSHOT = HERE / "determined_0_38_1_api.json"
DOC = HERE.parents[1] / "docs" / "determined-compat.md"

STATUSES = ("same", "compatible", "not supported", "out of scope", "different", "missing")
RANK = {status: i for i, status in enumerate(STATUSES)}
#: Marker set on callables that raise NotSupported (ckptstore._not_supported.MARKER).
NOT_SUPPORTED_MARKER = "__ckptstore_not_supported__"

#: Names that are not part of the Keras-facing surface, with the reason shown in the table.
OUT_OF_SCOPE: dict[str, str] = {
    "determined.ExperimentConfig": "the master's config object; configs load with ckptstore.experiment",
    "determined.LegacyTrial": "base of every legacy Trial; TFKerasTrial is the Keras one",
    "determined.TrialController": "harness internals",
    "determined.EnvContext": "harness internals (TFKerasTrialContext.env is provided)",
    "determined.RendezvousInfo": "cluster rendezvous; ranks come from TF_CONFIG",
    "determined.ResourcesInfo": "cluster resources",
    "determined.TrialContext": "base of the legacy trial contexts; TFKerasTrialContext is the Keras one",
    "determined.import_from_path": "harness helper",
    "determined.core.DummyCheckpointContext": "test helper over Determined's storage managers",
    "determined.core.DummyExperimentalCoreContext": "test helper",
    "determined.core.DummyPreemptContext": "test helper",
    "determined.core.DummyProfilerContext": "test helper",
    "determined.core.DummyTrainContext": "test helper",
    "determined.core.ExperimentalCoreContext": "master-side experimental API",
    "determined.core.ProfilerContext": "the profiler needs the master",
    "determined.keras.TFKerasTrialController": "harness internals (ckptstore's own controller runs TFKerasTrial)",
    "determined.keras.TFKerasTrainConfig": "harness internals",
    "determined.experimental.Project": "master-side projects",
    "determined.experimental.client.Oauth2ScimClient": "master-side user management",
    "determined.experimental.client.Project": "master-side projects",
    "determined.experimental.client.ResourcePool": "master-side resource pools",
    "determined.experimental.client.User": "master-side users",
    "determined.experimental.client.Workspace": "master-side workspaces",
    "determined.errors.EnterpriseOnlyError": "master-side (Enterprise Edition) features",
    "determined.errors.InternalException": "harness internals",
    "determined.errors.MultipleDownloadsFailed": "master-proxied downloads",
    "determined.errors.NoDirectStorageAccess": "master-proxied downloads",
    "determined.errors.ProxiedDownloadFailed": "master-proxied downloads",
    "determined.errors.SkipWorkloadException": "harness internals (workloads)",
    "determined.errors.StopLoadingImplementation": "harness internals",
    "determined.errors.WorkerError": "harness internals (worker processes)",
    "determined.errors.WorkerFinishedGracefully": "harness internals (worker processes)",
}
#: Classes whose constructor is internal in Determined (users get them from core.init() or a
#: client call), so only their members are compared.
INTERNAL_CONSTRUCTORS = {
    "determined.ClusterInfo",
    "determined.TrialInfo",
    "determined.core.CheckpointContext",
    "determined.core.Context",
    "determined.core.PreemptContext",
    "determined.core.SearcherContext",
    "determined.core.SearcherOperation",
    "determined.core.TrainContext",
    "determined.keras.TFKerasTrialContext",
    "determined.keras.TFKerasExperimentalContext",
    "determined.experimental.client.TrialMetrics",
    "determined.experimental.client.TrainingMetrics",
    "determined.experimental.client.ValidationMetrics",
}


@dataclasses.dataclass
class Row:
    name: str
    determined: str
    ckptstore: str
    status: str
    notes: str = ""


# ---- ckptstore side -------------------------------------------------------------------------------
def _snapshot_script() -> types.ModuleType:
    """scripts/determined_api_snapshot.py: one owner of how a signature is written down, for
    both sides of the comparison."""
    path = HERE.parents[1] / "scripts" / "determined_api_snapshot.py"
    spec = importlib.util.spec_from_file_location("determined_api_snapshot", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SCRIPT = _snapshot_script()
default_text = _SCRIPT.default_text
params_of = _SCRIPT.params_of


def format_params(params: list[list[Any]] | None) -> str:
    if params is None:
        return "(?)"
    parts: list[str] = []
    star_done = False
    for name, kind, default in params:
        if kind == "kw" and not star_done:
            parts.append("*")
            star_done = True
        if kind == "*":
            star_done = True
            parts.append(f"*{name}")
        elif kind == "**":
            parts.append(f"**{name}")
        else:
            parts.append(name if default is None else f"{name}={default}")
    return "(" + ", ".join(parts) + ")"


def not_supported_hint(obj: Any) -> str | None:
    target = getattr(obj, "__func__", obj)
    return getattr(target, NOT_SUPPORTED_MARKER, None)


# ---- comparison ---------------------------------------------------------------------------------
def compare_params(det: list[list[Any]] | None, ours: list[list[Any]] | None) -> tuple[str, str]:
    """``(status, notes)`` for a Determined signature against ours."""
    if det is None or ours is None:
        return "compatible", "signature not introspectable"
    if det == ours:
        return "same", ""
    if det and all(p[1] in ("*", "**") for p in det):
        # Determined forwards (*args, **kwargs) to tf.keras; ours spells Keras's parameters out.
        return "compatible", "Determined forwards *args/**kwargs"
    ours_names = {p[0]: p for p in ours}
    our_var = any(p[1] == "*" for p in ours)
    our_varkw = any(p[1] == "**" for p in ours)
    det_positional = [p for p in det if p[1] in ("posonly", "pos")]
    our_positional = [p for p in ours if p[1] in ("posonly", "pos")]
    problems: list[str] = []
    notes: list[str] = []
    for i, (name, _kind, default) in enumerate(det_positional):
        if i < len(our_positional):
            if our_positional[i][0] != name:
                problems.append(f"positional #{i + 1} is {our_positional[i][0]!r}, not {name!r}")
            elif default is not None and our_positional[i][2] is None:
                problems.append(f"{name!r} is required here")
            elif default is None and our_positional[i][2] is not None:
                notes.append(f"{name} optional here (default {our_positional[i][2]})")
            elif default != our_positional[i][2]:
                notes.append(f"default {name}={our_positional[i][2]} (Determined: {default})")
        elif not our_var:
            problems.append(f"no positional {name!r}")
    for name, kind, default in det:
        if kind == "kw":
            mine = ours_names.get(name)
            if mine is None and not our_varkw:
                problems.append(f"no keyword {name!r}")
            elif mine is not None and mine[1] not in ("pos", "kw"):
                problems.append(f"{name!r} is not a keyword here")
            elif mine is not None and default is not None and mine[2] is None:
                problems.append(f"{name!r} is required here")
            elif mine is not None and default is None and mine[2] is not None:
                notes.append(f"{name} optional here (default {mine[2]})")
            elif mine is not None and default != mine[2]:
                notes.append(f"default {name}={mine[2]} (Determined: {default})")
        elif kind == "*" and not our_var:
            problems.append("no *args")
        elif kind == "**" and not our_varkw:
            problems.append("no **kwargs")
    det_names = {p[0] for p in det}
    covered = {p[0] for p in our_positional[: len(det_positional)]}  # reported above if renamed
    extra = [p for p in ours if p[0] not in det_names | covered and p[1] not in ("*", "**")]
    for name, _kind, default in extra:
        if default is None:
            problems.append(f"extra required parameter {name!r}")
        else:
            notes.append(f"adds {name}")
    if problems:
        return "different", "; ".join(problems)
    return "compatible", "; ".join(notes)


def _lookup(module: Any, name: str) -> Any:
    return getattr(module, name, _MISSING)


_MISSING = object()


def _rows_for_class(full: str, det_entry: dict[str, Any], ours: Any) -> Iterator[Row]:
    if det_entry["kind"] == "enum":
        det_members = det_entry["members"]
        if not (inspect.isclass(ours) and issubclass(ours, enum.Enum)):
            yield Row(full, "enum", type(ours).__name__, "different", "not an enum")
            return
        our_members = {m.name: m.value for m in ours}
        missing = sorted(set(det_members) - set(our_members))
        differ = sorted(
            k for k in det_members if k in our_members and our_members[k] != det_members[k]
        )
        status = "different" if missing or differ else "same"
        notes = "; ".join(
            ([f"missing members {missing}"] if missing else [])
            + ([f"other values {differ}"] if differ else [])
        )
        yield Row(full, "enum " + ", ".join(det_members), "enum", status, notes)
        return
    if not inspect.isclass(ours):
        yield Row(full, "class", type(ours).__name__, "different", "not a class")
        return
    if "init" in det_entry and full not in INTERNAL_CONSTRUCTORS:
        our_init = (
            params_of(ours.__init__, drop_self=True) if "__init__" in _dict_chain(ours) else []
        )
        status, notes = compare_params(det_entry["init"], our_init)
        yield Row(full, format_params(det_entry["init"]), format_params(our_init), status, notes)
    else:
        yield Row(
            full,
            "class",
            "class",
            "same",
            "constructed by ckptstore, not by users" if full in INTERNAL_CONSTRUCTORS else "",
        )
    for member, info in sorted(det_entry.get("members", {}).items()):
        yield _member_row(f"{full}.{member}", info, ours, member)


def _dict_chain(cls: type) -> set[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        names |= set(vars(klass))
    return names


def _member_row(full: str, info: dict[str, Any], ours_cls: type, member: str) -> Row:
    kind = info["kind"]
    static = _MISSING
    for klass in ours_cls.__mro__:
        if member in vars(klass):
            static = vars(klass)[member]
            break
    if static is _MISSING and member in _instance_attributes(ours_cls):
        static = "attribute"
    if static is _MISSING:
        return Row(full, kind, "", "missing")
    hint = not_supported_hint(static)
    if hint:
        return Row(full, kind, "raises NotSupported", "not supported", f"use {hint}")
    if kind in ("property", "attribute"):
        return Row(full, kind, "yes", "same")
    if isinstance(static, (staticmethod, classmethod)):
        func = static.__func__
        drop = isinstance(static, classmethod)
    elif inspect.isfunction(static):
        func, drop = static, True
    else:
        return Row(full, kind, type(static).__name__, "compatible", "not a method here")
    ours_params = params_of(func, drop_self=drop)
    status, notes = compare_params(info.get("params"), ours_params)
    return Row(full, format_params(info.get("params")), format_params(ours_params), status, notes)


def _instance_attributes(cls: type) -> set[str]:
    """Public ``self.x = ...`` names set in any method of ``cls`` or its ckptstore bases."""
    import ast
    import textwrap

    names: set[str] = set(getattr(cls, "__annotations__", {}))
    for klass in cls.__mro__:
        if klass is object or not klass.__module__.startswith("ckptstore"):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else ([node.target] if isinstance(node, ast.AnnAssign) else [])
            )
            for t in targets:
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    names.add(t.attr)
    for klass in cls.__mro__:
        names |= {k for k, v in vars(klass).items() if isinstance(v, property)}
    if dataclasses.is_dataclass(cls):
        names |= {f.name for f in dataclasses.fields(cls)}
    return names


def rows_for(snapshot: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for det_module, names in snapshot["modules"].items():
        our_module_name = "ckptstore" + det_module[len("determined") :]
        try:
            our_module = importlib.import_module(our_module_name)
        except ImportError:
            our_module = None
        for name, entry in names.items():
            full = f"{det_module}.{name}"
            if full in OUT_OF_SCOPE:
                ours = _MISSING if our_module is None else _lookup(our_module, name)
                rows.append(
                    Row(
                        full,
                        entry["kind"],
                        "" if ours is _MISSING else "yes",
                        "out of scope",
                        OUT_OF_SCOPE[full],
                    )
                )
                continue
            ours = _MISSING if our_module is None else _lookup(our_module, name)
            if ours is _MISSING:
                rows.append(Row(full, entry["kind"], "", "missing"))
                continue
            hint = not_supported_hint(ours)
            if hint:
                rows.append(
                    Row(full, entry["kind"], "raises NotSupported", "not supported", f"use {hint}")
                )
                continue
            kind = entry["kind"]
            if kind == "module":
                ok = isinstance(ours, types.ModuleType)
                rows.append(
                    Row(full, "module", "module" if ok else "", "same" if ok else "different")
                )
            elif kind == "constant":
                same = ours == entry["value"]
                rows.append(
                    Row(full, repr(entry["value"]), repr(ours), "same" if same else "different")
                )
            elif kind == "function":
                if not callable(ours):
                    rows.append(Row(full, "function", type(ours).__name__, "different"))
                    continue
                ours_params = params_of(ours, drop_self=False)
                status, notes = compare_params(entry["params"], ours_params)
                rows.append(
                    Row(
                        full,
                        format_params(entry["params"]),
                        format_params(ours_params),
                        status,
                        notes,
                    )
                )
            elif kind in ("class", "exception", "enum"):
                rows.extend(_rows_for_class(full, entry, ours))
            else:
                rows.append(Row(full, kind, "yes", "same"))
    return rows


# ---- markdown -----------------------------------------------------------------------------------
# The table is one generated section of docs/determined-compat.md, between these markers; the
# prose around it (and sections other issues append) is hand-written and kept by --write.
BEGIN = "<!-- BEGIN generated by tests/compat/api_surface.py --write: edit the generator -->"
END = "<!-- END generated -->"
HEADER = """## Every Determined 0.38.1 name, compared

Generated by `PYTHONPATH=$PWD .venv/bin/python -m tests.compat.api_surface --write` from
`tests/compat/determined_0_38_1_api.json` (extracted from the real `determined==0.38.1` wheel by
`scripts/determined_api_snapshot.py`); `tests/compat/test_api_surface.py` fails when a row gets
worse. Every `determined.X` name is looked up as `ckptstore.X` (`import ckptstore as det`).

Statuses: **same** (same parameters, order, defaults), **compatible** (every Determined call
works; notes list extra optional parameters or other defaults), **not supported** (exists and
raises `ckptstore.errors.NotSupported` naming what to use; needs a Determined cluster, or data
the registry does not keep), **out of scope** (not Keras-facing), **different**, **missing**.

"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(rows: list[Row]) -> str:
    counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
    out = [HEADER, "Summary: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) + ".\n"]
    current = None
    for row in rows:
        module = _module_of(row.name)
        if module != current:
            current = module
            out.append(
                f"\n### `{module}`\n\n| name | Determined 0.38.1 | ckptstore | status | notes |\n|---|---|---|---|---|"
            )
        out.append(
            f"| `{_cell(row.name)}` | {_cell(row.determined)} | {_cell(row.ckptstore)} | "
            f"{row.status} | {_cell(row.notes)} |"
        )
    return "\n".join(out) + "\n"


def replace_generated(document: str, table: str) -> str:
    """``document`` with the text between the markers replaced by ``table`` (the whole
    document when it has no markers yet)."""
    block = f"{BEGIN}\n{table}{END}\n"
    if BEGIN not in document or END not in document:
        return block
    head, rest = document.split(BEGIN, 1)
    tail = rest.split(END, 1)[1].lstrip("\n")
    return head + block + ("\n" + tail if tail else "")


_MODULES: list[str] = []


def _module_of(name: str) -> str:
    for module in sorted(_MODULES, key=len, reverse=True):
        if name.startswith(module + "."):
            return module
    return name.rsplit(".", 1)[0]


_ROW = re.compile(r"^\| `(?P<name>[^`]+)` \|.*\| (?P<status>[a-z ]+) \| [^|]*\|$")


def documented_statuses(text: str) -> dict[str, str]:
    """name -> status, parsed from a rendered table."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = _ROW.match(line)
        if match and match["status"] in RANK:
            found[match["name"].replace("\\|", "|")] = match["status"]
    return found


def load_snapshot() -> dict[str, Any]:
    snapshot = json.loads(SNAPSHOT.read_text())
    _MODULES[:] = list(snapshot["modules"])
    return snapshot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {DOC}")
    args = parser.parse_args(argv)
    rows = rows_for(load_snapshot())
    text = render(rows)
    if args.write:
        DOC.parent.mkdir(parents=True, exist_ok=True)
        DOC.write_text(replace_generated(DOC.read_text() if DOC.exists() else "", text))
        print(f"wrote {DOC} ({len(rows)} rows)")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
