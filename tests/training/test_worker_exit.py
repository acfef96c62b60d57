"""How a rank's process ends (ctrkit.training.distributed.end_worker_process, ctrkit.cli.run): without the
interpreter's finalization, but with its exit handlers run, its output flushed and its exit status kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    base["PYTHONPATH"] = os.pathsep.join([SRC, *([base["PYTHONPATH"]] if base.get("PYTHONPATH") else [])])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**base, **env}, check=False)


def test_a_worker_ends_with_its_status_its_output_flushed_and_its_exit_handlers_run(tmp_path):
    out = tmp_path / "written.txt"
    p = _python(
        "import atexit, logging, sys\n"
        "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
        "atexit.register(lambda: print('exit handler ran'))\n"
        f"f = open({str(out)!r}, 'w'); f.write('kept'); del f\n"  # closed only when collected
        "print('buffered', end='')\n"
        "logging.getLogger('x').info('logged')\n"
        "from ctrkit.training.distributed import end_worker_process\n"
        "end_worker_process(3)\n"
        "print('not reached')\n")
    assert p.returncode == 3, p.stderr
    assert p.stdout.startswith("buffered") and "exit handler ran" in p.stdout and "not reached" not in p.stdout
    assert "logged" in p.stderr
    assert out.read_text() == "kept"


def test_the_command_line_keeps_its_exit_status_as_a_rank_and_outside_one(tmp_path):
    bad = str(tmp_path / "missing.yaml")
    code = f"import sys; sys.argv = ['ctrkit', 'train', '--config', {bad!r}]\nfrom ctrkit.cli import run\nrun()\n"
    alone = _python(code)
    rank = _python(code, RANK="0", WORLD_SIZE="1")
    assert alone.returncode == rank.returncode == 2, (alone.stderr, rank.stderr)
    assert "missing.yaml" in alone.stderr and "missing.yaml" in rank.stderr
