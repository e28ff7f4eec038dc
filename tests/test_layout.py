"""The house's floors (`schemas/layout.py`): no module imports upward, no import cycle between modules.

Every import of every module counts, the ones inside functions and under `if TYPE_CHECKING:` too (a lazy import
is still a dependency), and so do the lazy re-exports of a package's `__init__.py` (`_EXPORTS`). Importing
another module's `_private` name is refused as well.
"""

from __future__ import annotations

import ast
import functools
import os
from dataclasses import dataclass
from pathlib import Path

from schemas.layout import FLOORS

REPO = Path(os.environ.get("REPLAB_LAYOUT_ROOT", Path(__file__).resolve().parent.parent))
TOP = {p for floor in FLOORS for p in floor}
FLOOR_OF = {p: i for i, floor in enumerate(FLOORS) for p in floor}


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported module
    line: int
    names: tuple[str, ...]  # names taken with `from target import ...`


def module_name(file: Path, root: Path = REPO) -> str:
    parts = list(file.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_files(root: Path = REPO) -> list[Path]:
    return sorted(f for top in TOP if (root / top).is_dir() for f in (root / top).rglob("*.py")
                  if "__pycache__" not in f.parts)


def resolve(name: str, modules: set[str]) -> str | None:
    """The project module an import names (its longest existing prefix), or None (not ours)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def imports_of(file: Path, modules: set[str], root: Path = REPO) -> list[Edge]:
    source = module_name(file, root)
    is_package = file.name == "__init__.py"
    tree = ast.parse(file.read_text(), str(file))
    out: list[Edge] = []

    def add(name: str, line: int, names: tuple[str, ...] = ()) -> None:
        target = resolve(name, modules)
        if target is not None and target != source:
            out.append(Edge(source, target, line, names))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level - 1
                package = source.split(".") if is_package else source.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:  # `from package import module`
                    add(sub, node.lineno)
                else:
                    add(base, node.lineno, (alias.name,))
        elif (is_package and isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
              and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets)):
            for value in node.value.values:  # lazy re-exports: name -> "package.module"
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    add(value.value, node.lineno)
    return out


@functools.cache
def graph(root: Path = REPO) -> tuple[frozenset[str], tuple[Edge, ...]]:
    files = project_files(root)
    modules = {module_name(f, root) for f in files}
    return frozenset(modules), tuple(e for f in files for e in imports_of(f, set(modules), root))


def upward_edges(edges: tuple[Edge, ...]) -> list[str]:
    bad = []
    for e in edges:
        src, dst = e.source.split(".")[0], e.target.split(".")[0]
        if FLOOR_OF[dst] > FLOOR_OF[src]:
            bad.append(f"{e.source}:{e.line} imports {e.target} ({dst} sits above {src})")
    return bad


def private_imports(edges: tuple[Edge, ...]) -> list[str]:
    return [f"{e.source}:{e.line} imports {e.target}.{n}" for e in edges for n in e.names
            if n.startswith("_") and not n.startswith("__")]


def cycles(modules: frozenset[str], edges: tuple[Edge, ...]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    succ: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        succ[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(succ[v]):
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

    for m in sorted(modules):
        if m not in index:
            visit(m)
    return found


def test_every_top_level_package_has_a_floor():
    on_disk = {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()}
    assert on_disk <= TOP, f"packages without a floor in schemas/layout.py: {sorted(on_disk - TOP)}"


def test_the_walk_sees_lazy_and_type_checking_imports():
    # engine.replay imports engine.tracking only inside a function, and the stream's query imports the
    # stream source inside functions: both must be edges, or the layout checks below would prove nothing.
    _, edges = graph()
    pairs = {(e.source, e.target) for e in edges}
    assert ("engine.replay", "engine.tracking") in pairs
    assert ("engine.stream.query", "engine.stream.source") in pairs
    assert ("report.tables", "engine.plan") in pairs  # under `if TYPE_CHECKING:`


def test_no_upward_import():
    _, edges = graph()
    assert upward_edges(edges) == []


def test_no_import_cycle():
    modules, edges = graph()
    assert cycles(modules, edges) == []


def test_no_private_name_of_another_module():
    _, edges = graph()
    assert private_imports(edges) == []


#: The readability rules for the replay engines (kernels, reference interpreters, control planes): a class
#: of about 300 lines at most, and derived events dispatched through a handler table.
MAX_CLASS_LINES = 350


def long_classes(root: Path = REPO, limit: int = MAX_CLASS_LINES) -> list[tuple[str, str, int]]:
    out = []
    for file in sorted((root / "replay").rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > limit:
                out.append((module_name(file, root), node.name, node.end_lineno - node.lineno + 1))
    return out


def name_dispatches(root: Path = REPO) -> list[tuple[str, int]]:
    """`getattr(obj, "_on_" + what)` or `getattr(obj, f"_on_{what}")`: a handler looked up by a name built at the
    call (a dataclass field's name, `getattr(self, f.name)`, is not one)."""
    out = []
    for file in sorted((root / "replay").rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                    and len(node.args) >= 2 and isinstance(node.args[1], (ast.BinOp, ast.JoinedStr)):
                out.append((module_name(file, root), node.lineno))
    return out


def test_replay_classes_stay_short_and_dispatch_through_tables(tmp_path):
    assert long_classes() == []
    assert name_dispatches() == []
    # the checks see what they look for
    (tmp_path / "replay").mkdir()
    (tmp_path / "replay" / "x.py").write_text("class Big:\n" + "    a = 1\n" * MAX_CLASS_LINES +
                                              "def f(self, what):\n    getattr(self, '_on_' + what)()\n"
                                              "    getattr(self, f'_on_{what}')()\n    getattr(self, what)\n")
    assert long_classes(tmp_path) == [("replay.x", "Big", MAX_CLASS_LINES + 1)]
    assert name_dispatches(tmp_path) == [("replay.x", MAX_CLASS_LINES + 3), ("replay.x", MAX_CLASS_LINES + 4)]


#: The replay wing by family. Each family package holds the same rooms, so the two read alike.
FAMILY_ROOMS = ("family.py", "routing.py", "reference/interpreter.py", "kernels/kernel.py")
FAMILY_PACKAGES = ("kafka", "rocketmq")


def test_each_replay_family_has_the_same_rooms_and_is_listed_explicitly():
    replay = REPO / "replay"
    for family in FAMILY_PACKAGES:
        missing = [room for room in FAMILY_ROOMS if not (replay / family / room).is_file()]
        assert missing == [], f"replay/{family}/ lacks {missing}"
    # family code lives in its package, not at replay/'s root
    assert [f.name for f in replay.glob("*.py") if f.stem.startswith(FAMILY_PACKAGES)] == []
    # families are imported where they are listed, never found by an import hook
    _, edges = graph()
    listed = {e.target for e in edges if e.source == "replay.families"}
    assert {f"replay.{family}.family" for family in FAMILY_PACKAGES} <= listed
    hooks = [f for f in replay.rglob("*.py") if "importlib" in f.read_text()]
    assert hooks == []
