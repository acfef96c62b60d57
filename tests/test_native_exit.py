"""A command that fails with a clear error exits 2 with that one line, every time: no reader or prefetch thread
still running at interpreter exit turns it into a native abort ("terminate called without an active exception",
exit 134). The abort was a race, so each failing command runs 20 times, in fresh interpreters, a few at a time."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ctrkit
from ctrkit.cli import main

RUNS = 20
AT_ONCE = 2
TIMEOUT_S = 120  # one command; each takes a few seconds (mostly importing torch)


def _run_many(argv: list[str], cwd: Path) -> list[tuple[int, str]]:
    """(exit code, stderr) of ``RUNS`` runs of ``ctrkit argv``, ``AT_ONCE`` at a time."""
    env = {**os.environ, "PYTHONPATH": str(Path(ctrkit.__file__).resolve().parents[1])}  # this ctrkit
    results: list[tuple[int, str]] = []
    for start in range(0, RUNS, AT_ONCE):
        procs = [subprocess.Popen([sys.executable, "-m", "ctrkit", *argv], cwd=cwd, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(min(AT_ONCE, RUNS - start))]
        for p in procs:
            out, err = p.communicate(timeout=TIMEOUT_S)
            results.append((p.returncode, out + err))
    return results


def _assert_clean_errors(results: list[tuple[int, str]], message: str) -> None:
    bad = [(rc, out) for rc, out in results if rc != 2 or out.strip().count("\n") != 0 or message not in out]
    assert not bad, f"{len(bad)} of {len(results)} runs did not exit 2 with one line; first: {bad[0]}"


@pytest.mark.slow
def test_preprocess_behaviour_of_an_empty_csv_always_exits_2_with_one_line(tmp_path):
    (tmp_path / "empty.csv").write_bytes(b"")
    results = _run_many(["preprocess", "behaviour", "empty.csv", "--out", "out"], tmp_path)
    _assert_clean_errors(results, "empty.csv: cannot read the CSV header")


@pytest.mark.slow
def test_predict_of_a_table_checkpoint_on_a_criteo_file_always_exits_2_with_one_line(tmp_path):
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from ctrkit.data.sources.table import preprocess_table

    rng = np.random.default_rng(0)
    n = 300
    pacsv.write_csv(pa.table({"label": rng.integers(0, 2, n), "x": rng.normal(size=n).round(3),
                              "u": [f"u{k}" for k in rng.integers(0, 20, n)]}), tmp_path / "rows.csv")
    spec = {"label": "label", "dense": ["x"], "sparse": [{"name": "u", "embedding_dim": 4}]}
    stores = preprocess_table(tmp_path / "rows.csv", spec, tmp_path / "st", split="0.8,0.2,0")
    (tmp_path / "c.yaml").write_text(f"data: {{train: {stores['train']}, valid: {stores['valid']}}}\n"
                                     "model: {name: lr}\ntrain: {epochs: 1, progress: false}\n"
                                     f"run: {{dir: {tmp_path / 'runs'}, name: t}}\n")
    assert main(["train", "--config", str(tmp_path / "c.yaml"), "--quiet"]) == 0
    criteo = "\t".join(["1", *["3"] * 13, *["68fd1e64"] * 26])
    (tmp_path / "day.tsv").write_text((criteo + "\n") * 20)
    results = _run_many(["predict", "--checkpoint", "runs/t/best.pt", "--input", "day.tsv", "--out", "p.csv"],
                        tmp_path)
    _assert_clean_errors(results, "day.tsv")


def test_stop_all_ends_a_worker_whose_consumer_was_dropped_unclosed():
    """A consumer that stops reading without closing its generator (kept alive by a traceback, say) leaves its
    worker blocked on a full queue; stop_all (run by the CLI and at interpreter exit) ends and joins it."""
    from ctrkit.background import background, live_workers, stop_all

    it = background(iter(range(1000)), 1, name="ctrkit-test-dropped")
    assert next(it) == 0
    time.sleep(0.2)  # the worker fills the queue and waits to put the next item
    worker = [t for t in threading.enumerate() if t.name == "ctrkit-test-dropped"]
    assert worker and worker[0].is_alive() and worker[0] in live_workers()
    assert stop_all(timeout=5) == 0
    assert not worker[0].is_alive() and worker[0] not in live_workers()
