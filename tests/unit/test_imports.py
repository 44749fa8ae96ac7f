"""The library's import graph: no cycle between modules, counting imports deferred into functions."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kombu_ladder", "celery_ladder")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _runtime_imports(tree: ast.AST) -> list[ast.AST]:
    """Every import statement, in functions too, but not under ``if TYPE_CHECKING:``."""
    out: list[ast.AST] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.extend(_runtime_imports(ast.Module(body=node.orelse, type_ignores=[])))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        else:
            out.extend(_runtime_imports(node))
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the library modules it imports (``from . import x`` counts as importing module x)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in _runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else (node.module or "")
                targets = [t for t in (f"{base}.{a.name}" for a in node.names) if t in modules] or [base]
            else:
                targets = [a.name for a in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_library_has_no_import_cycle_counting_deferred_imports() -> None:
    graph = import_graph()
    assert "kombu_ladder.relay.core" in graph["kombu_ladder.relay.driver"]  # the graph sees imports at all
    assert "celery_ladder.bootstep" in graph["celery_ladder"]  # ... and deferred ones
    assert cycles(graph) == []


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_kombu_ladder_never_imports_celery_ladder() -> None:
    graph = import_graph()
    assert not [(m, t) for m, targets in graph.items() if m.startswith("kombu_ladder")
                for t in targets if t.startswith("celery_ladder")]


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def _in(package: str, module: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_reach_follows_imports_through_other_modules() -> None:
    assert reach({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a"}}, "a") == {"b", "c"}


def test_the_simulator_sits_below_the_relay_and_neither_knows_the_other() -> None:
    """The simulator is a stub broker: it reaches no relay module, even through another, and the relay
    reaches no simulator module (it holds a transport through kombu_ladder.link alone)."""
    graph = import_graph()
    simulator = [m for m in graph if _in("kombu_ladder.simulator", m)]
    relay = [m for m in graph if _in("kombu_ladder.relay", m)]
    assert "kombu_ladder.link" in graph["kombu_ladder.simulator.link"]  # both stand on the link
    assert "kombu_ladder.link" in graph["kombu_ladder.relay.core"]
    assert not {(m, t) for m in simulator for t in reach(graph, m) if _in("kombu_ladder.relay", t)}
    assert not {(m, t) for m in relay for t in reach(graph, m) if _in("kombu_ladder.simulator", t)}


def test_the_link_and_the_pure_rules_stand_on_nothing_above_them() -> None:
    """What the relay and the simulator both stand on imports neither (nor anything that does)."""
    graph = import_graph()
    for module in ("kombu_ladder.link", "kombu_ladder.plan", "kombu_ladder.envelope", "kombu_ladder.wire"):
        above = {t for t in reach(graph, module) if _in("kombu_ladder.relay", t) or _in("kombu_ladder.simulator", t)}
        assert not above, (module, above)


def test_the_control_plane_users_reach_nothing_of_the_relay() -> None:
    """The index, migrate, peek and adoption read and write the control plane through kombu_ladder.controlplane,
    and import no module of the relay's; nor does the control plane (not even through another module)."""
    graph = import_graph()
    users = [m for m in graph if _in("kombu_ladder.index", m) or _in("celery_ladder.adoption", m)
             or m in ("kombu_ladder.migrate", "kombu_ladder.peek")]
    plane = [m for m in graph if _in("kombu_ladder.controlplane", m)]
    assert "kombu_ladder.controlplane.reader" in graph["kombu_ladder.index.reader"]  # the graph sees them
    assert not {(m, t) for m in users for t in graph[m] if _in("kombu_ladder.relay", t)}
    assert not {(m, t) for m in plane for t in reach(graph, m) if _in("kombu_ladder.relay", t)}


def test_one_module_outside_the_simulator_names_the_stream_offset() -> None:
    """Every stream of the control plane is read by kombu_ladder.controlplane.reader: the only module (the simulator
    aside, which models the broker) where a stream offset is asked for or read."""
    naming = {str(path.relative_to(ROOT)) for package in PACKAGES for path in (ROOT / package).rglob("*.py")
              if "x-stream-offset" in path.read_text() and "simulator" not in path.parts}
    assert naming == {"kombu_ladder/controlplane/reader.py"}
