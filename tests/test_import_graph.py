"""No import circle inside ``capo_verl/``: every import of one capo_verl module by another, at the top of a module or
inside a function, is an edge, and the graph of them has no cycle. A circle broken only by an import inside a
function is still a circle: the two modules cannot be read, tested or moved apart."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "capo_verl"


def module_names() -> dict[str, Path]:
    """``{dotted module name: file}`` of every module of the package (a package is its ``__init__``)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The capo_verl modules that module ``name`` imports anywhere in its source: ``import a.b``, ``from a import
    b`` (``a.b`` when it is a module, else ``a``), relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # import a.b.c of a name: the module that holds it
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_circle_through_a_function_level_import(tmp_path):
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    pkg = tmp_path / "capo_verl"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "one.py").write_text("from capo_verl.sub.two import X\n")
    (pkg / "sub" / "two.py").write_text("def f():\n    from . import one\n")
    modules = {"capo_verl": pkg / "__init__.py", "capo_verl.sub": pkg / "sub" / "__init__.py"}
    modules |= {f"capo_verl.sub.{m}": pkg / "sub" / f"{m}.py" for m in ("one", "two")}
    assert import_edges("capo_verl.sub.two", modules["capo_verl.sub.two"], modules) == {"capo_verl.sub.one"}
    graph = {name: import_edges(name, path, modules) for name, path in modules.items()}
    assert cycles(graph) == [["capo_verl.sub.one", "capo_verl.sub.two"]]


def test_capo_verl_has_no_import_circle():
    modules = module_names()
    graph = {name: import_edges(name, path, modules) for name, path in modules.items()}
    assert sum(map(len, graph.values())) > 50  # the graph was read
    assert cycles(graph) == []
