"""Parallel / distributed Criteo preprocessing (issue 30): the same stores for any number of workers, any task
cut and any finishing order; MLPerf's modulo ids; damaged and missing days; resume; disk full."""

from __future__ import annotations

import errno
import filecmp
import gzip
import json
import logging
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ctrkit.data.pipeline.persist import load_pipeline
from ctrkit.data.pipeline.vocab import Vocabulary
from ctrkit.data.sources import criteo_parallel, criteo_tasks
from ctrkit.data.sources.criteo import SPARSE_NAMES, preprocess_criteo
from ctrkit.data.sources.synthetic import write_criteo_tsv
from ctrkit.data.storage.spill import ShardSpill
from ctrkit.data.storage.store import Store, _AppendArray
from ctrkit.errors import DataError, StoreError
from tests.conftest import store_rows


def _days(d: Path, rows: int = 2000, gz_day: int | None = 1, card: int = 400) -> list[Path]:
    d.mkdir(parents=True, exist_ok=True)
    return [write_criteo_tsv(d / (f"day_{i}.gz" if i == gz_day else f"day_{i}"), rows, seed=i, max_cardinality=card)
            for i in range(3)]


def _files(p: Path) -> list[Path]:
    """The files of a store, but for its record of verified files (inode numbers and times: this file system's)."""
    return sorted(x.relative_to(p) for x in p.rglob("*") if x.is_file() and x.name != ".verified.json")


def assert_same_stores(a: dict[str, Path], b: dict[str, Path]) -> None:
    """Every file byte for byte; manifests too, but for the creation time and the read block size."""
    assert sorted(a) == sorted(b)
    for split, pa in a.items():
        pb = b[split]
        assert _files(pa) == _files(pb)
        for f in _files(pa):
            if f.name != "manifest.json":
                assert filecmp.cmp(pa / f, pb / f, shallow=False), (split, f)
                continue
            ma, mb = json.loads((pa / f).read_text()), json.loads((pb / f).read_text())
            for m in (ma, mb):
                m.pop("created")
                m["preprocessing"]["options"].pop("block_rows")
            assert ma == mb, (split, f)


def _naive_first_appearance(files: list[Path], col: int, min_freq: int) -> list[int]:
    """Kept keys of categorical column ``col`` in first-appearance order over (day, row), by a Python loop."""
    counts: dict[int, int] = {}
    for f in files:
        opener: Any = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt") as fh:
            for line in fh:
                v = line.rstrip("\n").split("\t")[14 + col]
                if v:
                    counts[int(v, 16)] = counts.get(int(v, 16), 0) + 1
    return [k for k, c in counts.items() if c >= min_freq]  # dicts keep insertion (first-appearance) order


def test_any_workers_task_cut_and_block_size_give_the_same_stores(tmp_path: Path) -> None:
    days = _days(tmp_path / "in", card=5000)  # thousands of distinct values per column: vocabularies grow
    opts = {"min_freq": 2, "valid_from_test": True, "shard_bytes": 100_000, "progress": False}
    serial = preprocess_criteo(days, tmp_path / "serial", **opts)
    one = preprocess_criteo(days, tmp_path / "w1", workers=1, task_bytes=80_000, **opts)
    two = preprocess_criteo(days, tmp_path / "w2", workers=2, task_bytes=50_000, block_rows=64, **opts)
    assert len(criteo_tasks.plan_tasks(days, 50_000)) > len(days)  # plain days really were cut in ranges
    assert_same_stores(serial, one)
    assert_same_stores(serial, two)
    assert not list((tmp_path / "w2").glob(".criteo-*"))  # staging removed after publishing
    vocabs = load_pipeline(two["train"]).vocabs_
    assert max(v.seen for v in vocabs.values()) > 1024  # distinct values counted, past one growth of the counts
    for j in (0, 5, 20):
        want = _naive_first_appearance(days, j, 2)
        assert vocabs[SPARSE_NAMES[j]].keys.tolist() == want
        assert vocabs[SPARSE_NAMES[j]].ids.tolist() == list(range(2, 2 + len(want)))


def test_finishing_order_does_not_matter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tasks finished by an earlier run in reverse order (as a resumed run finds them) -> the same stores."""
    days = _days(tmp_path / "in", gz_day=None)
    kw: dict[str, Any] = {"task_bytes": 60_000, "shard_bytes": 100_000, "progress": False}
    want = preprocess_criteo(days, tmp_path / "a", workers=1, **kw)
    calls: list[int] = []
    real = criteo_tasks.encode_task

    def reverse_then_rest(task: Any, line0: int, ctx: Any) -> Any:
        if not calls:  # the first call runs every task, last one first, before any result is merged
            plan = criteo_tasks.plan_tasks(days, kw["task_bytes"])
            firsts = criteo_parallel._count(criteo_parallel.TaskRunner(), plan, _FakeFront(days), Path(ctx.stage),
                                            ctx.block_bytes)
            for t in reversed(plan):
                calls.append(t.index)
                real(t, firsts[t.index], ctx)
        return real(task, line0, ctx)

    monkeypatch.setattr(criteo_parallel, "encode_task", reverse_then_rest)  # what the runner is given
    got = preprocess_criteo(days, tmp_path / "b", workers=1, **kw)
    assert calls == sorted(calls, reverse=True) and len(calls) > 3
    assert_same_stores(want, got)


@pytest.mark.parametrize("gz_day", [2, None])
def test_valid_from_test_is_the_first_half_of_the_last_day(tmp_path: Path, gz_day: int | None) -> None:
    """torchrec / MLPerf: valid = the first ceil(n / 2) rows of the last day, test = the rest, in day order; also
    where nothing else needs a count step (modulo ids, no fit) and the last day is cut into several tasks."""
    days = _days(tmp_path / "in", rows=301, gz_day=gz_day)
    opts = {"max_vocab": 1000, "valid_from_test": True, "progress": False}
    serial = preprocess_criteo(days, tmp_path / "serial", **opts)
    two = preprocess_criteo(days, tmp_path / "w2", workers=2, task_bytes=20_000, **opts)
    assert_same_stores(serial, two)
    whole = preprocess_criteo(days, tmp_path / "whole", **{**opts, "valid_from_test": False})
    rows = store_rows(whole["test"])  # the last day in order (modulo ids: no fit, the same ids)
    assert len(rows) == 301
    np.testing.assert_array_equal(store_rows(serial["valid"]), rows[:151])
    np.testing.assert_array_equal(store_rows(serial["test"]), rows[151:])


class _FakeFront:
    """Just what the count step reads of a front-end: files and an already fitted (no-count) pipeline."""

    def __init__(self, files: list[Path]) -> None:
        from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
        self.files = files
        self.pipe = FeaturePipeline.criteo()
        self.pipe.vocabs_ = {}
        self.rule = criteo_tasks.RouteRule(0, True, len(files))


def test_mlperf_modulo_ids_match_the_formula() -> None:
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 1 << 32, 100_000, dtype=np.int64)
    miss = rng.random(len(keys)) < 0.05
    for n in (40_000_000, 39_060, 3):
        v = Vocabulary.modulo("C1", n)
        got = v.lookup(keys, miss)
        want = np.array([0 if m else int(k) % n for k, m in zip(keys.tolist(), miss.tolist())])
        np.testing.assert_array_equal(got, want)
        assert v.size == n and len(v.keys) == 0  # nothing held: memory independent of the data


def test_mlperf_hash_end_to_end_any_workers(tmp_path: Path) -> None:
    days = _days(tmp_path / "in", rows=1000)
    res = preprocess_criteo(days, tmp_path / "o", max_vocab=1000, workers=2, task_bytes=60_000, progress=False)
    s = Store(res["test"])  # the last day in input order: compare row by row with the raw file
    with open(days[-1]) as f:
        raw = [ln.rstrip("\n").split("\t") for ln in f]
    for j in (0, 2, 25):
        want = [int(r[14 + j], 16) % 1000 if r[14 + j] else 0 for r in raw]
        assert np.asarray(s[SPARSE_NAMES[j]]).tolist() == want
    assert s.schema.feature("C1").vocab_size == 1000


@pytest.mark.parametrize("workers", [None, 1])
def test_damaged_gzip_day_keeps_rows_before_the_damage(tmp_path: Path, workers: int | None,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    days = _days(tmp_path / "in", gz_day=1)
    data = days[1].read_bytes()
    cut = data[: len(data) * 2 // 3]
    days[1].write_bytes(cut)  # truncated mid-stream
    kept = _decodable(cut).count(b"\n")  # whole lines only: the one the damage cut is no row
    with caplog.at_level(logging.WARNING):
        res = preprocess_criteo(days, tmp_path / "o", workers=workers, task_bytes=50_000, progress=False)
    stats = Store(res["train"]).manifest["stats"]
    assert stats["files"][1]["rows"] == kept and stats["input_rows"] == 2000 + kept + 2000
    [d] = stats["damaged_files"]
    assert d["file"] == str(days[1]) and d["rows_kept"] == kept and d["partial_line"] is True
    assert "day_1.gz is damaged" in caplog.text and f"its {kept} rows before the damage are kept" in caplog.text
    assert Store(res["train"]).num_rows + Store(res["test"]).num_rows == 4000 + kept

    crc = bytes(b ^ 0xFF for b in data[-8:-4])
    days[1].write_bytes(data[:-8] + crc + data[-4:])  # corrupt (checksum), not truncated
    res = preprocess_criteo(days, tmp_path / "o2", workers=workers, progress=False)
    [d] = Store(res["train"]).manifest["stats"]["damaged_files"]
    assert "corrupt gzip data" in d["reason"]
    assert d["rows_kept"] == _decodable(days[1].read_bytes()).count(b"\n") == 2000


def _decodable(data: bytes) -> bytes:
    """The naive reference: feed a decoder one byte at a time until it fails or ends."""
    d, out = zlib.decompressobj(wbits=31), []
    for i in range(len(data)):
        try:
            out.append(d.decompress(data[i:i + 1]))
        except zlib.error:
            break
    return b"".join(out)


def test_missing_day_in_the_middle_is_an_error(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    files = [write_criteo_tsv(d / f"day_{i}", 50, seed=i) for i in (0, 1, 3)]
    with pytest.raises(DataError, match=r"skip day_2 between day_0 and day_3; given: day_0, day_1, day_3"):
        preprocess_criteo(files, tmp_path / "o", progress=False)
    with pytest.raises(DataError, match=r"skip day_2"):
        preprocess_criteo(d, tmp_path / "o", workers=1, progress=False)  # the directory: same check


@pytest.mark.parametrize("how", [{"workers": 1}, {"resumable": True}, {"resumable": True, "min_freq": 2}],
                         ids=["workers1", "one-process", "one-process-exact"])
def test_interrupted_run_resumes_without_redoing_finished_days(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               how: dict[str, Any]) -> None:
    days = _days(tmp_path / "in", gz_day=None)
    kw: dict[str, Any] = {**how, "shard_bytes": 100_000, "progress": False, "task_bytes": 60_000}
    if how.get("resumable"):  # whole days as tasks, whatever task_bytes says; the plain one-process stores
        want = preprocess_criteo(days, tmp_path / "ref", min_freq=how.get("min_freq", 1), shard_bytes=100_000,
                                 progress=False)
    else:
        kw["task_bytes"] = 64 << 20  # one task per day
        want = preprocess_criteo(days, tmp_path / "ref", **kw)
    done: list[str] = []
    real = criteo_tasks._encode_rows

    def stop_at_last_day(task: Any, *a: Any) -> Any:
        if task.file_index == 2:
            raise KeyboardInterrupt  # Ctrl-C while day_2 is encoded
        done.append(Path(task.path).name)
        return real(task, *a)

    monkeypatch.setattr(criteo_tasks, "_encode_rows", stop_at_last_day)
    with pytest.raises(KeyboardInterrupt):
        preprocess_criteo(days, tmp_path / "o", **kw)
    assert done == ["day_0", "day_1"]
    assert not any((tmp_path / "o" / s).exists() for s in ("train", "valid", "test"))  # nothing half-published
    [stage] = list((tmp_path / "o").glob(".criteo-stage-*"))
    assert sorted(p.name for p in (stage / "encode").iterdir()) == ["t000000", "t000001"]  # no partial task

    done.clear()
    monkeypatch.setattr(criteo_tasks, "_encode_rows", lambda task, *a: (done.append(Path(task.path).name),
                                                                         real(task, *a))[1])
    got = preprocess_criteo(days, tmp_path / "o", **kw)
    assert done == ["day_2"]  # the finished days were not redone
    assert_same_stores(want, got)
    assert not stage.exists()


@pytest.mark.parametrize("workers", [None, 1])
@pytest.mark.parametrize("where", [(_AppendArray, "append"), (ShardSpill, "add")], ids=["store", "spill"])
def test_disk_full_is_one_line_and_removes_partial_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          workers: int | None, where: tuple[Any, str]) -> None:
    days = _days(tmp_path / "in", rows=300, gz_day=None)

    def full(self: Any, *args: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(where[0], where[1], full)
    with pytest.raises(StoreError) as e:
        preprocess_criteo(days, tmp_path / "o", workers=workers, progress=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("disk full while") and "No space left on device" in msg
    left = sorted(p.name for p in (tmp_path / "o").iterdir())
    if workers is None or where[0] is ShardSpill:  # nothing finished (the first task failed): nothing kept
        assert left == []
    else:  # finished tasks stay for a resumed run, and the message says where
        assert len(left) == 1 and left[0].startswith(".criteo-stage-") and left[0] in msg


def test_exact_vocabularies_spilled_to_disk_give_the_same_stores(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    days = _days(tmp_path / "in", card=5000)
    opts = {"min_freq": 2, "valid_from_test": True, "shard_bytes": 100_000, "progress": False}
    want = preprocess_criteo(days, tmp_path / "mem", **opts)
    runs: list[int] = []
    real = criteo_tasks.count_task
    monkeypatch.setattr("ctrkit.data.sources.criteo_parallel.count_task",
                        lambda *a: (r := real(*a), runs.append(r.runs))[0])
    # ~300 KiB budget (26 columns): a run every few blocks of 64 rows, keys repeated across runs of a task and across tasks
    got = preprocess_criteo(days, tmp_path / "spill", vocab_memory_mb=0.3, block_rows=64, task_bytes=200_000,
                            **opts)
    assert len(runs) > len(days) and max(runs) > 2 and not list((tmp_path / "spill").glob(".criteo-*"))
    assert_same_stores(want, got)
    vocabs = load_pipeline(got["train"]).vocabs_
    for j in (0, 20):
        assert vocabs[SPARSE_NAMES[j]].keys.tolist() == _naive_first_appearance(days, j, 2)


def test_bad_vocab_memory_is_one_clear_error(tmp_path: Path) -> None:
    days = _days(tmp_path / "in", rows=20)
    with pytest.raises(DataError, match=r"--vocab-memory-mb must be > 0 .* got 0"):
        preprocess_criteo(days, tmp_path / "o", vocab_memory_mb=0, progress=False)


def test_dask_local_cluster_gives_the_same_stores(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    from distributed import LocalCluster

    days = _days(tmp_path / "in", rows=1000)
    kw: dict[str, Any] = {"min_freq": 2, "task_bytes": 60_000, "shard_bytes": 100_000, "progress": False}
    want = preprocess_criteo(days, tmp_path / "one", workers=1, **kw)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        got = preprocess_criteo(days, tmp_path / "dask", scheduler=cluster.scheduler_address, **kw)
    assert_same_stores(want, got)


def test_unreachable_scheduler_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("distributed")
    from ctrkit.data.sources import task_runner
    from ctrkit.errors import ConfigError

    monkeypatch.setattr(task_runner, "CONNECT_TIMEOUT", "1s")
    days = _days(tmp_path / "in", rows=50)
    with pytest.raises(ConfigError, match=r"--scheduler tcp://127.0.0.1:1: cannot reach the Dask scheduler"):
        preprocess_criteo(days, tmp_path / "o", scheduler="tcp://127.0.0.1:1", progress=False)


# Peak RSS as VmHWM of the child's own address space: getrusage's ru_maxrss survives execve on Linux, so a child
# of the (large) pytest process would report at least the parent's size at the fork.
_RSS_CHILD = r"""
import json, re, sys
from ctrkit.data.sources.criteo import preprocess_criteo
src, out, kw = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
preprocess_criteo(src, out, progress=False, **kw)
status = open("/proc/self/status").read()
print(json.dumps(int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024))
"""


@pytest.mark.slow
@pytest.mark.parametrize("opts", [{"max_vocab": 100_000, "workers": 1},  # MLPerf ids: no vocabulary held
                                  {"min_freq": 2}],  # exact vocabularies, one process: they hold the cardinality
                         ids=["hash-tasks", "exact-serial"])
def test_peak_memory_is_set_by_options_not_rows(tmp_path: Path, opts: dict[str, Any]) -> None:
    """The same cardinalities, 4x the rows: peak RSS of the preprocessing process within 10%. 400k rows of
    encoded data are ~64 MB, ~20% of the process, so holding them (or a share of them) would show."""
    import os
    import subprocess
    import sys

    if not Path("/proc/self/status").is_file():
        pytest.skip("peak RSS is read from /proc/self/status (Linux)")
    src_dir = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(src_dir), os.environ.get("PYTHONPATH")]))}
    kw = {**opts, "shard_bytes": 4 << 20, "block_rows": 4096, "task_bytes": 8 << 20}
    peak = []
    for rows in (100_000, 400_000):
        src = write_criteo_tsv(tmp_path / f"r{rows}.tsv", rows, max_cardinality=1000)
        out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(src), str(tmp_path / f"o{rows}"), json.dumps(kw)],
                             check=False, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        peak.append(float(out.stdout.strip().splitlines()[-1]))
        src.unlink()
    assert peak[1] <= 1.10 * peak[0], f"peak RSS {peak[0]:.0f} MB at 100k rows, {peak[1]:.0f} MB at 400k rows"
