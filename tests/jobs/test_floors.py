"""The jobs' place in the layout, beyond tests/test_layout.py's floors: only the CLI and its twin in Python
(``ctrkit.api``, what ``import ctrkit`` exposes) import a job, and the task kind of a model is read in one
place (an AST scan of src/, no imports run)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "ctrkit"


def _imports(path: Path) -> set[str]:
    """Every ``ctrkit...`` module ``path`` imports (top level or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ctrkit"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("ctrkit"))
    return out


def _importers(package: str) -> dict[str, set[str]]:
    """{file under src/ctrkit: the modules of ``package`` it imports}, files that import none left out."""
    found = {}
    for f in SRC.rglob("*.py"):
        hits = {m for m in _imports(f) if m == package or m.startswith(package + ".")}
        if hits:
            found[str(f.relative_to(SRC))] = hits
    return found


def test_only_the_cli_the_api_and_the_jobs_import_the_jobs():
    assert {f for f in _importers("ctrkit.jobs") if not f.startswith("jobs/")} == {"cli.py", "api.py"}


def test_the_task_kind_is_read_in_one_place():
    readers = [str(f.relative_to(SRC)) for f in SRC.rglob("*.py") if 'task_kind ==' in f.read_text()]
    assert readers in ([], ["jobs/tasks.py"])
