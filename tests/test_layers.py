"""The architecture is a checked contract: import-linter's layers and forbidden contracts
(``[tool.importlinter]`` in pyproject.toml), plus no import cycle between any two modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run(
        [str(lint), "--config", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    modules = sorted(m for m in graph.modules if m.startswith("ckptstore"))
    edges = {
        m: sorted(
            w for w in graph.find_modules_directly_imported_by(m) if w.startswith("ckptstore")
        )
        for m in modules
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            recurse = False
            for j in range(i, len(edges[node])):
                nxt = edges[node][j]
                if nxt not in index:
                    work.append((node, j + 1))
                    work.append((nxt, 0))
                    recurse = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if recurse:
                continue
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def test_no_import_cycles():
    graph = grimp.build_graph("ckptstore", exclude_type_checking_imports=True)
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    # The check above must be able to fail: a graph with a two-module circle.
    graph = grimp.ImportGraph()
    for name in ("ckptstore.a", "ckptstore.b", "ckptstore.c"):
        graph.add_module(name)
    graph.add_import(importer="ckptstore.a", imported="ckptstore.b")
    graph.add_import(importer="ckptstore.b", imported="ckptstore.a")
    graph.add_import(importer="ckptstore.b", imported="ckptstore.c")
    assert _cycles(graph) == [["ckptstore.a", "ckptstore.b"]]
