"""The shape of the code base, checked from source text alone (no imports, no torch).

- Imports point one way (docs/design.md §1.3): no cycle between modules, no upward import.
- No Python module of engine/, services/ or training/ passes 400 lines (STYLE.md habit 7).
- Every `docs/design.md §N` citation in the code names a section of docs/design.md, and no
  code cites any other design file.

Imports under `if TYPE_CHECKING:` are ignored: they never run. Imports inside functions
count: they run, and they are dependencies all the same.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRAPH_PACKAGES = ("engine", "services", "training", "benchmarks")
SIZE_PACKAGES = ("engine", "services", "training")
MAX_LINES = 400
DESIGN_DOC = ROOT / "docs" / "design.md"
CITATION_DIRS = ("engine", "services", "training", "charts", "benchmarks", "tests", "scripts")
CITATION_FILES = ("Dockerfile", "Makefile")
CITATION_SUFFIXES = (".py", ".c", ".h", ".yaml", ".tpl", ".sh")
SKIPPED_DIRS = {"__pycache__", ".venv", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


# -- the import graph ------------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported module (internal: resolved to a module file; external: as written)
    path: str  # importing file, relative to the repository root
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.path}:{self.line})"


def _python_files(top: str) -> Iterator[Path]:
    base = ROOT / top
    if not base.is_dir():
        return
    for path in sorted(base.rglob("*.py")):
        if not SKIPPED_DIRS.intersection(path.relative_to(ROOT).parts):
            yield path


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for top in GRAPH_PACKAGES for p in _python_files(top)}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement except those in the body of `if TYPE_CHECKING:`."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _resolve(name: str, modules: dict[str, Path]) -> str:
    """The longest prefix of `name` that is a module of the repository, else `name`."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return name


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [_resolve(alias.name, modules) for alias in node.names]
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, node.module] if node.module else package)
    else:
        base = node.module or ""
    out = []
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        out.append(submodule if submodule in modules else _resolve(base, modules))
    return out


@cache
def import_edges() -> tuple[Edge, ...]:
    modules = _modules()
    edges: list[Edge] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = str(path.relative_to(ROOT))
        for node in _runtime_imports(tree):
            for target in _targets(node, module, path.name == "__init__.py", modules):
                if target != module:
                    edges.append(Edge(module, target, rel, node.lineno))
    return tuple(sorted(set(edges), key=lambda e: (e.path, e.line, e.target)))


def _top(name: str) -> str:
    return name.split(".", 1)[0]


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _format(edges: list[Edge]) -> str:
    return "\n  ".join(str(e) for e in edges)


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module, or with a self-loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    components.append(sorted(component))
    return components


def _one_cycle(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first)."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return component


def test_no_import_cycles() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    where: dict[tuple[str, str], Edge] = {}
    for edge in import_edges():
        if edge.target in modules:
            graph[edge.source].add(edge.target)
            where.setdefault((edge.source, edge.target), edge)
    reports = []
    for component in _strongly_connected(graph):
        cycle = _one_cycle(component, graph)
        steps = "\n    ".join(str(where[(a, b)]) for a, b in zip(cycle, cycle[1:], strict=False))
        reports.append(f"cycle among {len(component)} modules ({', '.join(component)}), e.g.:\n    {steps}")
    assert not reports, f"{len(reports)} import cycle(s) (imports under TYPE_CHECKING excepted):\n  " + "\n  ".join(
        reports
    )


def _violations(source_prefix: str, forbidden: tuple[str, ...], allowed_paths: tuple[str, ...] = ()) -> list[Edge]:
    return [
        e
        for e in import_edges()
        if _within(e.source, source_prefix)
        and any(_within(e.target, f) for f in forbidden)
        and e.path not in allowed_paths
    ]


def test_engine_imports_nothing_above_it() -> None:
    bad = _violations("engine", ("services", "training", "benchmarks", "tests"))
    assert not bad, "engine imports from services/training/benchmarks/tests (design.md §1.3):\n  " + _format(bad)


def test_training_imports_neither_services_nor_benchmarks() -> None:
    bad = _violations("training", ("services", "benchmarks", "tests"))
    assert not bad, "training imports from services/benchmarks/tests (design.md §1.3):\n  " + _format(bad)


def test_services_import_training_only_in_the_train_drafter_adapter() -> None:
    bad = _violations("services", ("training",), allowed_paths=("services/cli/train_drafter.py",))
    bad += _violations("services", ("benchmarks", "tests"))
    assert not bad, (
        "services imports training outside services/cli/train_drafter.py, or benchmarks/tests "
        "(design.md §1.3):\n  " + _format(bad)
    )


def test_kernels_import_only_kernels() -> None:
    bad = [e for e in _violations("engine.kernels", ("engine",)) if not _within(e.target, "engine.kernels")]
    assert not bad, "engine/kernels imports engine modules outside engine.kernels (design.md §1.3):\n  " + _format(bad)


def test_models_do_not_import_the_runner() -> None:
    bad = _violations("engine.models", ("engine.runner",))
    assert not bad, "engine/models imports engine/runner (design.md §1.3):\n  " + _format(bad)


# -- file size ---------------------------------------------------------------------------------


def test_no_module_over_400_lines() -> None:
    """Data lives in data files (JSON, safetensors), which this rule does not count."""
    long_files = []
    for top in SIZE_PACKAGES:
        for path in _python_files(top):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_LINES:
                long_files.append((lines, str(path.relative_to(ROOT))))
    long_files.sort(reverse=True)
    listing = "\n  ".join(f"{path}: {lines} lines" for lines, path in long_files)
    assert not long_files, f"{len(long_files)} module(s) over {MAX_LINES} lines; split them:\n  {listing}"


# -- citations of the design doc -------------------------------------------------------------

# Any reference to a design file, with whatever path precedes it (`DESIGN.md`, `docs/design.md`).
_DESIGN_REF = re.compile(r"[\w./-]*design\.md", re.IGNORECASE)
# A citation: `docs/design.md` then section numbers, e.g. `§4`, `§3–§4`, `§2, §4`, `(§4.2)`.
_CITATION = re.compile(r"docs/design\.md(?:'s)?[\s#*/(]*((?:§\s*\d+(?:\.\d+)*(?:\s*(?:,|–|-|and|&)\s*)?)+)")
_SECTION = re.compile(r"§\s*(\d+(?:\.\d+)*)")


def _citing_files() -> Iterator[Path]:
    this_file = Path(__file__).resolve()
    for top in CITATION_DIRS:
        base = ROOT / top
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if (
                path.is_file()
                and path.suffix in CITATION_SUFFIXES
                and not SKIPPED_DIRS.intersection(path.relative_to(ROOT).parts)
                and path.resolve() != this_file
            ):
                yield path
    for name in CITATION_FILES:
        if (ROOT / name).is_file():
            yield ROOT / name


def _headings() -> list[str]:
    text = DESIGN_DOC.read_text(encoding="utf-8")
    return [line.lstrip("#").strip() for line in text.splitlines() if re.match(r"#{1,6}\s", line)]


def _names_heading(section: str, headings: list[str]) -> bool:
    """`4` matches a heading starting `4.`; `4.2` one starting `4.2 ` or `4.2.`."""
    return any(h.startswith(section + ".") or h.startswith(section + " ") for h in headings)


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def test_design_doc_has_the_cited_top_level_sections() -> None:
    headings = _headings()
    missing = [n for n in ("1", "2", "3", "4", "5", "6", "7") if not _names_heading(n, headings)]
    assert not missing, f"docs/design.md lacks top-level sections {missing}; headings: {headings}"


def test_code_cites_only_docs_design_md() -> None:
    wrong = []
    for path in _citing_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in _DESIGN_REF.finditer(text):
            if match.group(0) != "docs/design.md":
                line = _line_of(text, match.start())
                snippet = text.splitlines()[line - 1].strip()
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0)!r} in: {snippet}")
    assert not wrong, (
        f"{len(wrong)} reference(s) to a design file other than `docs/design.md` (the team's brief is "
        "not part of the project; cite docs/design.md, same section):\n  " + "\n  ".join(wrong)
    )


def test_every_citation_names_a_section_of_the_design_doc() -> None:
    headings = _headings()
    dangling = []
    for path in _citing_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in _CITATION.finditer(text):
            for section in _SECTION.findall(match.group(1)):
                if not _names_heading(section, headings):
                    line = _line_of(text, match.start())
                    dangling.append(f"{path.relative_to(ROOT)}:{line}: §{section}")
    numbered = [h for h in headings if re.match(r"\d", h)]
    assert not dangling, (
        f"{len(dangling)} citation(s) of docs/design.md name no section there:\n  "
        + "\n  ".join(dangling)
        + "\nnumbered headings of docs/design.md:\n  "
        + "\n  ".join(numbered)
    )
