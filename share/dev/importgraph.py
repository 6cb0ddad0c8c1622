#!/usr/bin/env python3
"""Figures of slurm_gpu's import graph: modules, units, layers, upward imports, loops.

    python share/dev/importgraph.py [--json] [--edges] [--root DIR]     (or: make graph)

Reads every ``slurm_gpu/**/*.py`` with ``ast`` (nothing is imported or run), counting every
``import`` and ``from ... import`` of a ``slurm_gpu`` module, those inside functions too (a lazy
import is still a dependency). A *unit* is a top-level module or sub-package
(``slurm_gpu.config``, ``slurm_gpu.live``...), as the layers are declared. Printed:

- modules, units and the import edges between them;
- floors: the length of the longest chain of unit imports (a unit stands above all it imports);
- upward imports: edges from a unit to one declared ABOVE it in the ``layers`` contract of
  ``pyproject.toml`` (the same order ``lint-imports`` enforces);
- loops: groups of modules that import each other (strongly connected components with more
  than one module), and the same between units.

Exit status 0 always: the rules are enforced by ``make lint`` (``lint-imports``), this prints
the picture's figures.
"""

from __future__ import annotations

import ast
import json
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = "slurm_gpu"


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` depends on the module; ``from mod import name`` on the
            # module that defines the name (grimp's reading, which lint-imports uses).
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        for t in targets:
            while t and t not in known:  # ``import a.b.c`` of a name inside a module
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith(PKG + "."):
                out.add(t)
    return out


def unit_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def sccs(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def declared_layers(root: Path) -> list[list[str]]:
    """The ``layers`` contract's order, top first: each entry the units of one layer."""
    conf = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    for c in conf["tool"]["importlinter"]["contracts"]:
        if c.get("type") == "layers":
            return [
                [f"{PKG}.{u.strip()}" for u in layer.replace(":", "|").split("|")]
                for layer in c["layers"]
            ]
    return []


def figures_of(root: Path) -> tuple[dict[str, object], list[str], dict[str, set[str]]]:
    """The figures of the tree at ``root``, its units and the imports between them."""
    files = sorted((root / PKG).rglob("*.py"))
    names = {module_name(f, root): f for f in files}
    known = set(names)
    mod_edges = {n: imports_of(f, n, known) for n, f in names.items()}
    unit_edges: dict[str, set[str]] = defaultdict(set)
    for a, targets in mod_edges.items():
        for b in targets:
            ua, ub = unit_of(a), unit_of(b)
            if ua != ub and ua != PKG and ub != PKG:
                unit_edges[ua].add(ub)
    units = sorted({unit_of(n) for n in names} - {PKG})
    layers = declared_layers(root)
    rank = {u: i for i, layer in enumerate(layers) for u in layer}
    upward = sorted(
        (a, b)
        for a, bs in mod_edges.items()
        for b in bs
        if unit_of(a) in rank and unit_of(b) in rank and rank[unit_of(b)] < rank[unit_of(a)]
    )
    undeclared = [u for u in units if u not in rank]
    unit_loops = sccs(units, unit_edges)
    floor: dict[str, int] = {}

    def height(u: str, seen: frozenset[str] = frozenset()) -> int:
        if u in floor:
            return floor[u]
        if u in seen:  # inside a loop: counted once
            return 0
        h = 1 + max((height(v, seen | {u}) for v in unit_edges.get(u, ())), default=0)
        floor[u] = h
        return h

    figures = {
        "modules": len(names),
        "units": len(units),
        "module imports": sum(len(v) for v in mod_edges.values()),
        "unit imports": sum(len(v) for v in unit_edges.values()),
        "floors": max((height(u) for u in units), default=0),
        "declared layers": len(layers),
        "units outside the declared layers": undeclared,
        "upward imports": [f"{a} -> {b}" for a, b in upward],
        "module loops": sccs(sorted(names), mod_edges),
        "unit loops": unit_loops,
    }
    return figures, units, unit_edges


def main(argv: list[str]) -> int:
    root = Path(argv[argv.index("--root") + 1]).resolve() if "--root" in argv else ROOT
    figures, units, unit_edges = figures_of(root)
    if "--json" in argv:
        print(json.dumps(figures, indent=2))
    else:
        for k, v in figures.items():
            if isinstance(v, list):
                print(f"{k}: {len(v)}")
                for item in v:
                    print(f"  {item}")
            else:
                print(f"{k}: {v}")
    if "--edges" in argv:
        for u in units:
            print(f"{u} -> {', '.join(sorted(unit_edges.get(u, ())))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
