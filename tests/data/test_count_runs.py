"""The on-disk count store (sorted runs merged in key order) against a dict reference. Exact Criteo vocabularies
spilled to disk end to end: tests/data/test_criteo_parallel.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ctrkit.data.storage.count_runs import merge_runs, run_length, write_run


@pytest.mark.parametrize("fan_in", [64, 3])  # 3: more runs than the fan-in, merged in two levels
def test_merge_runs_sums_counts_and_keeps_the_first_appearance(tmp_path: Path, fan_in: int) -> None:
    rng = np.random.default_rng(0)
    want: dict[int, list[int]] = {}  # key -> [count, first]
    paths = []
    for r in range(10):
        keys = np.unique(rng.integers(-50, 20_000, rng.integers(0, 3000)))  # negative keys, an empty run maybe
        rng.shuffle(keys)
        counts = rng.integers(1, 5, len(keys))
        first = rng.integers(0, 1 << 50, len(keys))
        for k, c, f in zip(keys.tolist(), counts.tolist(), first.tolist()):
            old = want.get(k, [0, f])
            want[k] = [old[0] + c, min(old[1], f)]
        paths.append(tmp_path / f"r{r}.bin")
        write_run(paths[-1], keys, counts, first)
        assert run_length(paths[-1]) == len(keys)
    blocks = list(merge_runs(paths, tmp_path / "scratch", memory_bytes=1, fan_in=fan_in))  # 1024-record blocks
    got = np.concatenate(blocks)
    assert len(blocks) > 1 and got["key"].tolist() == sorted(want)  # in key order, every key once
    assert [[c, f] for c, f in zip(got["count"].tolist(), got["first"].tolist())] == [want[k] for k in sorted(want)]
    assert all(p.is_file() for p in paths)  # the inputs stay; only intermediate runs are removed
    assert len(list((tmp_path / "scratch").glob("*"))) <= (len(paths) + fan_in - 1) // fan_in
