"""The import graph of the lm_resiliency package, from its source (every import statement,
at module level or inside a function), and the cycles in it: each strongly connected group
of two or more modules. Exits 1 and names them when there is one.

Usage: python scripts/import_graph.py [PACKAGE_DIR]   (default: python/lm_resiliency)

A package's __init__ importing its own submodules is not counted as an edge back: importing
``a.b`` runs ``a/__init__`` first whatever ``a/__init__`` imports, so it is no cycle."""

from __future__ import annotations

import ast
import os
import sys


def modules(root: str) -> dict[str, str]:
    """{dotted module name: file} of the package at `root`."""
    base = os.path.dirname(os.path.abspath(root))
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, base)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def _imported(module: str, is_package: bool, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    source = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - node.level + 1]
        source = ".".join(parts + ([node.module] if node.module else []))
    return [source] + [f"{source}.{alias.name}" for alias in node.names]


def edges(found: dict[str, str]) -> dict[str, set[str]]:
    """{module: the package's modules it imports}."""
    graph: dict[str, set[str]] = {m: set() for m in found}
    for module, path in found.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            for name in _imported(module, path.endswith("__init__.py"), node):
                while name and name not in found:  # a name imported from a module: that module
                    name = name.rpartition(".")[0]
                if name and name != module and not module.startswith(name + "."):
                    graph[module].add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of two or more modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def main() -> int:
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "python",
                                                             "lm_resiliency")
    found = cycles(edges(modules(root)))
    for group in found:
        print("import cycle: " + " -> ".join(group + group[:1]))
    print(f"{len(found)} import cycle(s) in {os.path.normpath(root)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
