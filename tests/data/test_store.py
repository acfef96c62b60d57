import json

import numpy as np
import pytest

from ctrkit.data.store import ColumnSpec, Store, StoreError, StoreWriter, write_store
from ctrkit.schema import DenseFeature, Schema, SparseFeature


def small_schema() -> Schema:
    return Schema(dense=[DenseFeature("x")], sparse=[SparseFeature("c", 10, 4), SparseFeature("tags", 7, 4, multi_valued=True)])


def test_streamed_chunks_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    cols = [ColumnSpec("label", "label", "<f4"), ColumnSpec("x", "dense", "<f4"), ColumnSpec("c", "sparse", "<i4"),
            ColumnSpec("tags", "jagged", "<i4")]
    chunks = []
    with StoreWriter(tmp_path / "s", small_schema(), cols) as w:
        for n in (5, 0, 7):
            lengths = rng.integers(0, 4, n)
            chunk = {"label": rng.random(n).astype("f4"), "x": rng.random(n).astype("f4"),
                     "c": rng.integers(0, 10, n).astype("i4"),
                     "tags": (rng.integers(0, 7, lengths.sum()).astype("i4"), lengths)}
            w.append(chunk)
            chunks.append(chunk)
        w.set_meta(preprocessing={"min_freq": 1}, stats={"rows": 12})
    s = Store(tmp_path / "s")
    assert len(s) == 12 and s.preprocessing == {"min_freq": 1}
    np.testing.assert_array_equal(s["c"], np.concatenate([c["c"] for c in chunks]))
    values, offsets = s["tags"]
    lengths = np.concatenate([c["tags"][1] for c in chunks])
    np.testing.assert_array_equal(np.diff(offsets), lengths)
    np.testing.assert_array_equal(values, np.concatenate([c["tags"][0] for c in chunks]))
    assert isinstance(s["x"], np.memmap)
    assert s.schema == small_schema()


def test_failure_leaves_nothing(tmp_path):
    cols = [ColumnSpec("label", "label", "<f4")]
    with pytest.raises(RuntimeError), StoreWriter(tmp_path / "s", small_schema(), cols) as w:
        w.append({"label": np.zeros(3, "f4")})
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_mismatched_files_are_rejected(tmp_path):
    p = write_store(tmp_path / "s", small_schema(), {"label": np.zeros(4, "f4"), "c": np.arange(4)},
                    {"label": "label", "c": "sparse"})
    Store(p)
    # a truncated column
    data = (p / "c.npy").read_bytes()
    (p / "c.npy").write_bytes(data[:-8])
    with pytest.raises(StoreError, match="c.npy does not match its checksum"):
        Store(p)
    (p / "c.npy").write_bytes(data)
    # manifest row count disagrees
    original = (p / "manifest.json").read_text()
    m = json.loads(original)
    m["num_rows"] = 5
    (p / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(StoreError, match="has 4 rows but the manifest says 5"):
        Store(p)
    (p / "manifest.json").write_text(original)
    (p / "c.npy").unlink()
    with pytest.raises(StoreError, match="missing"):
        Store(p)
    with pytest.raises(StoreError, match="not a ctrkit store"):
        Store(tmp_path)


def test_existing_output_needs_overwrite(tmp_path):
    args = (small_schema(), {"label": np.zeros(2, "f4")}, {"label": "label"})
    write_store(tmp_path / "s", *args)
    with pytest.raises(StoreError, match="already exists"):
        write_store(tmp_path / "s", *args)
    write_store(tmp_path / "s", *args, overwrite=True)
    assert len(Store(tmp_path / "s")) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["s"]
