# Copyright © 2026 Apple Inc.

"""No import cycles among mlx_lm's modules: every import of one of its
modules, at module level or inside a function, is an edge; the graph has no
cycle (a model's file that imports its drafter's, which imports it back, is
one, even where the import waits inside a function)."""

import ast
import unittest
from pathlib import Path

import mlx_lm

ROOT = Path(mlx_lm.__file__).resolve().parent
# 0.32.2's own: utils.load_adapters imports tuner.utils, which imports utils.
UPSTREAM = [["mlx_lm.tuner.utils", "mlx_lm.utils"]]


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)


def modules():
    """mlx_lm's modules, its packages' ``__init__`` left out (importing any
    module runs them)."""
    return {module_name(p): p for p in ROOT.rglob("*.py") if p.stem != "__init__"}


def imports(name: str, path: Path, known) -> set:
    """The modules of mlx_lm that ``name`` imports, anywhere in its file."""
    package = name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [(base, a.name) for a in node.names]
        else:
            continue
        for module, attr in targets:
            if attr and f"{module}.{attr}" in known:
                found.add(f"{module}.{attr}")
            elif module in known:
                found.add(module)
    found.discard(name)
    return found


def cycles(graph) -> list:
    """The strongly connected components of more than one module."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


class TestImportCycles(unittest.TestCase):

    def test_no_cycles(self):
        known = modules()
        graph = {n: sorted(imports(n, p, known)) for n, p in known.items()}
        self.assertEqual([c for c in cycles(graph) if c not in UPSTREAM], [])


if __name__ == "__main__":
    unittest.main()
