"""The import graph of ``capo_verl/``: no import circle, and no arrow between its rooms that points the wrong way.

Every import of one capo_verl module by another, at the top of a module or inside a function, is an edge.

- The graph has no cycle. A circle broken only by an import inside a function is still a circle: the two modules
  cannot be read, tested or moved apart.
- Each module lives in one room (:data:`EXACT`, :data:`PREFIXES`; drawn in ``docs/architecture.md``), and a room
  imports only the rooms below it (:data:`MAY_IMPORT`): the tools (``compare``, ``evaluation``, the commands) may
  import everything; the CPU port (``capo_verl/cpu/``) the core, the start checks and the shared helpers; the core
  the start checks and the shared helpers; the start checks only the shared helpers. The one arrow up is the CPU
  port's door (:data:`DOORS`): ``capo_verl.compat.install`` imports ``capo_verl.cpu`` inside the function, so
  importing the core never loads the CPU port (checked in a fresh interpreter too).
- ``docs/README.md``'s table "Where the code lives" names every module in its room.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "capo_verl"
DOCS_MAP = PACKAGE.parent / "docs" / "README.md"


def module_names() -> dict[str, Path]:
    """``{dotted module name: file}`` of every module of the package (a package is its ``__init__``)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_sites(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, bool]]:
    """``(capo_verl module imported, inside a function?)`` for every import in module ``name``'s source: ``import a.b``,
    ``from a import b`` (``a.b`` when it is a module, else ``a``), relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    sites = []

    def visit(node: ast.AST, in_function: bool) -> None:
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
            targets = []
        for target in targets:
            while target and target not in modules:  # import a.b.c of a name: the module that holds it
                target = target.rpartition(".")[0]
            if target and target != name:
                sites.append((target, in_function))
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(path.read_text()), False)
    return sites


def import_edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The capo_verl modules that module ``name`` imports anywhere in its source (:func:`import_sites`)."""
    return {target for target, _ in import_sites(name, path, modules)}


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


# --- the rooms and their one-way arrows (docs/architecture.md) ---------------------------------------------------
#: modules named one by one -> their room
EXACT = {
    "capo_verl": "core",
    "capo_verl.plugin": "core",
    "capo_verl._reward_worker": "core",
    "capo_verl.metrics": "core",
    "capo_verl.reward": "core",
    "capo_verl.compat.run_checks": "start checks",
    "capo_verl.compat.config_keys": "start checks",
    "capo_verl.compat.preflight": "start checks",
    "capo_verl.compat.resume": "start checks",
    "capo_verl.launch": "cpu port",  # the launcher's former name, an alias of capo_verl.cpu.launch
    "capo_verl.logs": "shared",
    "capo_verl.commands": "shared",
    "capo_verl.stored": "shared",
    "capo_verl.inputs": "shared",
    "capo_verl.outputs": "shared",
    "capo_verl.curves": "shared",
    "capo_verl.cli": "tools",
    "capo_verl.data": "tools",
    "capo_verl.demo": "tools",
    "capo_verl.mask_thresholds": "tools",
}
#: packages -> the room of every module in them (a module of :data:`EXACT` is in its own room)
PREFIXES = {
    "capo_verl.estimators": "core",
    "capo_verl.losses": "core",
    "capo_verl.compat": "core",
    "capo_verl.cpu": "cpu port",
    "capo_verl.compare": "tools",
    "capo_verl.evaluation": "tools",
}
#: room -> the rooms its modules may import
MAY_IMPORT = {
    "shared": {"shared"},
    "start checks": {"start checks", "shared"},
    "core": {"core", "start checks", "shared"},
    "cpu port": {"cpu port", "core", "start checks", "shared"},
    "tools": {"tools", "cpu port", "core", "start checks", "shared"},
}
#: the arrows up that are allowed, each only from inside a function: the CPU port's one door
DOORS = {("capo_verl.compat", "capo_verl.cpu")}


def room_of(module: str) -> str | None:
    """The room of ``module`` (:data:`EXACT`, else the longest matching :data:`PREFIXES`), or None."""
    if module in EXACT:
        return EXACT[module]
    packages = [p for p in PREFIXES if module == p or module.startswith(p + ".")]
    return PREFIXES[max(packages, key=len)] if packages else None


def wrong_way(modules: dict[str, Path]) -> list[str]:
    """Every import that points from a room to one it may not import, as ``a (room) -> b (room), line``; a door of
    :data:`DOORS` counts as wrong at the top of a module."""
    found = []
    for name, path in sorted(modules.items()):
        for target, in_function in import_sites(name, path, modules):
            source_room, target_room = room_of(name), room_of(target)
            if target_room in MAY_IMPORT[source_room] or ((name, target) in DOORS and in_function):
                continue
            where = "inside a function" if in_function else "at the top"
            found.append(f"{name} ({source_room}) -> {target} ({target_room}), {where}")
    return found


def test_every_module_is_in_a_room():
    assert [name for name in module_names() if room_of(name) is None] == []


def test_no_arrow_between_the_rooms_points_the_wrong_way():
    modules = module_names()
    assert {room_of(name) for name in modules} == set(MAY_IMPORT)  # every room has modules: the rules were read
    assert wrong_way(modules) == []


def test_the_arrow_check_finds_a_wrong_way_import_and_a_door_at_the_top(tmp_path):
    pkg = tmp_path / "capo_verl"
    for sub in ("compat", "cpu", "compare"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "metrics.py").write_text("def f():\n    from capo_verl.compare import report\n")
    (pkg / "compare" / "report.py").write_text("from capo_verl import metrics\n")
    (pkg / "cpu" / "shm.py").write_text("import capo_verl.compare.report\n")
    (pkg / "compat" / "__init__.py").write_text("import capo_verl.cpu\n\ndef install():\n    import capo_verl.cpu\n")
    modules = {
        "capo_verl": pkg / "__init__.py",
        "capo_verl.metrics": pkg / "metrics.py",
        "capo_verl.compare": pkg / "compare" / "__init__.py",
        "capo_verl.compare.report": pkg / "compare" / "report.py",
        "capo_verl.cpu": pkg / "cpu" / "__init__.py",
        "capo_verl.cpu.shm": pkg / "cpu" / "shm.py",
        "capo_verl.compat": pkg / "compat" / "__init__.py",
    }
    assert wrong_way(modules) == [
        "capo_verl.compat (core) -> capo_verl.cpu (cpu port), at the top",
        "capo_verl.cpu.shm (cpu port) -> capo_verl.compare.report (tools), at the top",
        "capo_verl.metrics (core) -> capo_verl.compare.report (tools), inside a function",
    ]


PROBE = textwrap.dedent(
    """
    import importlib, sys
    for name in sys.argv[1:]:
        importlib.import_module(name)
        loaded = [m for m in ("capo_verl.cpu", "capo_verl.compare", "capo_verl.evaluation") if m in sys.modules]
        print(name, *loaded)
    """
)

#: modules of the core a user imports; each is imported in turn, in one fresh interpreter
CORE = ["capo_verl", "capo_verl.estimators", "capo_verl.metrics", "capo_verl.losses.simko", "capo_verl.reward",
        "capo_verl.compat", "capo_verl.compat.methods"]  # fmt: skip


def loaded_with(modules: list[str], **env: str) -> dict[str, list[str]]:
    """``{module: [CPU port / study-tool packages in sys.modules right after importing it]}``, in a fresh
    interpreter."""
    environ = {**{k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}, **env}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, timeout=300, cwd="/", env=environ
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines() if line.startswith("capo_verl")}


def test_importing_the_core_loads_neither_the_cpu_port_nor_compare_nor_evaluation():
    seen = loaded_with(CORE)
    assert list(seen) == CORE
    assert {name: loaded for name, loaded in seen.items() if loaded} == {}


def test_the_plugin_loads_the_cpu_port_where_verl_runs_on_the_cpu_and_never_the_study_tools():
    """The control: the probe sees the CPU port when it is loaded (through its door, ``compat.install``)."""
    assert loaded_with(["capo_verl.plugin"], VERL_PLATFORM="cpu") == {"capo_verl.plugin": ["capo_verl.cpu"]}


def layout_rows() -> list[tuple[list[str], str]]:
    """``([paths], room)`` of each row of ``docs/README.md``'s table "Where the code lives"."""
    section = DOCS_MAP.read_text().split("## Where the code lives", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and cells[0].startswith("`"):
            rows.append((re.findall(r"`([^`]+)`", cells[0]), cells[1].lower()))
    return rows


def test_docs_layout_table_names_every_module_in_its_room():
    """Each module is named by its file, or by the folder that holds it (the most specific row wins), in a row of
    its own room (``shared`` for the shared helpers)."""
    rows = layout_rows()
    assert len(rows) > 10
    misplaced = {}
    for name, path in module_names().items():
        file = path.relative_to(PACKAGE.parent).as_posix()
        exact = [room for paths, room in rows if file in paths]
        folders = [(len(p), room) for paths, room in rows for p in paths if p.endswith("/") and file.startswith(p)]
        room = exact[0] if exact else max(folders)[1] if folders else None
        if room != room_of(name):
            misplaced[name] = (room, room_of(name))
    assert misplaced == {}
