"""The layout of record (DESIGN §7), checked on the source: floors, no import cycle, file and function sizes.

Floors go from the bottom up. A module may import from its own package and from any package on a lower
floor; packages on the same floor are siblings and do not import each other (``serving`` never imports
``train``). Imports inside functions count too; only ``if TYPE_CHECKING:`` blocks are left out (they never
run). A change that needs an arrow up moves the shared piece down instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# bottom -> top; each entry a package or module prefix
FLOORS: list[list[str]] = [
    ["ctrkit.errors", "ctrkit.version"],
    ["ctrkit.io", "ctrkit.progress", "ctrkit.background", "ctrkit.memory"],
    ["ctrkit.typecheck", "ctrkit.batch", "ctrkit.schema"],
    ["ctrkit.metrics", "ctrkit.stats"],
    ["ctrkit.data.pipeline", "ctrkit.data"],  # "ctrkit.data": the package itself (empty)
    ["ctrkit.data.storage"],
    ["ctrkit.data.sources"],
    ["ctrkit.nn"],
    ["ctrkit.retrieval"],
    ["ctrkit.models"],
    ["ctrkit.checkpoint"],
    ["ctrkit.training", "ctrkit.serving", "ctrkit.report"],
    ["ctrkit.jobs"],
    ["ctrkit.cli", "ctrkit.api"],
    ["ctrkit.cli_reference", "ctrkit.__main__", "ctrkit"],  # "ctrkit": the package's public names only
]

# Arrows that break the rules today, each to be removed by the step named; the list only shrinks.
KNOWN: dict[tuple[str, str], str] = {}
KNOWN_CYCLES: list[list[str]] = []

# Files over 400 lines / functions over 60 lines on the way to the limits (issue 25); the lists only shrink.
LONG_FILES: set[str] = set()
LONG_FUNCTIONS: set[str] = set()
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 60


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((SRC / "ctrkit").rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The ctrkit modules ``path`` imports (``from ctrkit.x import y`` counts as ctrkit.x.y when that is a module)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.split(".")[0] == "ctrkit")
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module and \
                    child.module.split(".")[0] == "ctrkit":
                for a in child.names:
                    sub = f"{child.module}.{a.name}"
                    found.add(sub if sub in modules else child.module)
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def _floor(module: str) -> tuple[int, str]:
    """(floor index, the prefix that places it): the longest prefix wins."""
    best: tuple[int, str] | None = None
    for i, prefixes in enumerate(FLOORS):
        for pre in prefixes:
            inside = module == pre or (pre != "ctrkit" and module.startswith(pre + "."))
            if inside and (best is None or len(pre) > len(best[1])):
                best = (i, pre)
    assert best is not None, f"{module} is on no floor: add it to FLOORS in {__file__}"
    return best


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(p, modules) - {m} for m, p in modules.items()}


def test_every_module_has_a_floor() -> None:
    for m in _modules():
        _floor(m)


def test_no_import_goes_up_or_sideways() -> None:
    bad = []
    for m, deps in _graph().items():
        fm, pm = _floor(m)
        for d in deps:
            fd, pd = _floor(d)
            if fd > fm or (fd == fm and pd != pm):
                bad.append((m, d))
    assert sorted(b for b in bad if b not in KNOWN) == []
    assert sorted(k for k in KNOWN if k not in bad) == [], "fixed: remove these from KNOWN"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
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

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_import_cycle() -> None:
    assert _cycles(_graph()) == KNOWN_CYCLES


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _long_functions() -> set[str]:
    out = set()
    for m, p in _modules().items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                out.add(f"{m}:{node.name}")
    return out


@pytest.mark.parametrize("kind", ["files", "functions"])
def test_sizes(kind: str) -> None:
    if kind == "files":
        found = {m for m, p in _modules().items() if len(p.read_text().splitlines()) > MAX_FILE_LINES}
        known = LONG_FILES
    else:
        found, known = _long_functions(), LONG_FUNCTIONS
    assert sorted(found - known) == [], f"over {MAX_FILE_LINES if kind == 'files' else MAX_FUNCTION_LINES} lines"
    assert sorted(known - found) == [], "now within the limit: remove these from the list"


def test_the_registry_knows_every_builtin_model_without_importing_the_models() -> None:
    """Importing only the registry module still registers every built-in: Python runs the package's
    ``__init__`` (which imports each model module) before any of its modules."""
    import subprocess
    import sys

    code = "from ctrkit.models.registry import list_models; print(len(list_models()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    modules = [p for p in (SRC / "ctrkit" / "models").glob("*.py") if not p.name.startswith("_")
               and p.stem not in ("registry", "base", "scoring")]
    assert int(out) >= len(modules) > 15


# ---- tests: a test module is imported by pytest only ----------------------------------------------------------
TESTS = Path(__file__).resolve().parent


def _is_test_module(dotted: str) -> bool:
    return dotted.rsplit(".", 1)[-1].startswith("test_")


def _imports_of_test_modules(source: str, test_stems: set[str]) -> list[str]:
    """The modules named test_* that ``source`` imports (``import test_x``, ``from test_x import y``,
    ``from tests.models.test_x import y``, ``from . import test_x``, ``importlib.import_module("test_x")``),
    inside functions too. ``from m import test_y`` counts when test_y is a test file of tests/ (a function
    named test_* imported from a library module does not)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if _is_test_module(module):
                found.append(module)
            found += [f"{module}.{a.name}" if node.module else module + a.name
                      for a in node.names if a.name in test_stems]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            arg = node.args[0].value
            if name == "import_module" and isinstance(arg, str) and _is_test_module(arg):
                found.append(arg)
    return found


def test_no_module_of_the_tests_imports_a_test_module() -> None:
    """A test module is collected, not imported: what two test files share lives in a helper module
    (tests/conftest.py, tests/models/contract_cases.py, tests/training/trainer_doubles.py, ...)."""
    files = sorted(TESTS.rglob("*.py"))
    stems = {p.stem for p in files if p.stem.startswith("test_")}
    bad = {str(p.relative_to(TESTS)): found for p in files
           if (found := _imports_of_test_modules(p.read_text(), stems))}
    assert bad == {}, "move what these import into a helper module (a file not named test_*.py)"


def test_the_test_import_check_finds_test_modules() -> None:
    stems = {"test_trainer", "test_models_contract"}
    source = """
import os
from conftest import make_batch
from ctrkit.training import trainer
from test_trainer import TinyCTR
import tests.models.test_models_contract as c
from . import test_trainer
from ctrkit.stats import test_split
def f():
    import importlib
    return importlib.import_module("test_dlrm")
"""
    assert _imports_of_test_modules(source, stems) == [
        "test_trainer", "tests.models.test_models_contract", ".test_trainer", "test_dlrm"]


def test_a_background_worker_stops_with_its_consumer() -> None:
    """ctrkit.background: items in order, the worker's error in the consumer, and no thread left running once
    the consumer breaks off (the source generator is closed, so its own cleanup runs)."""
    import threading

    from ctrkit.background import background

    closed = []

    def numbers():
        try:
            yield from range(100)
        finally:
            closed.append(True)

    assert list(background(range(10), 2)) == list(range(10))
    it = background(numbers(), 2, name="ctrkit-test-worker")
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    it.close()
    assert closed == [True]
    assert not [t for t in threading.enumerate() if t.name == "ctrkit-test-worker"]

    def broken():
        yield 1
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        list(background(broken()))
