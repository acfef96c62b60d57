import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from ctrkit.data.pipeline.rows import ColumnSpec
from ctrkit.data.sources.criteo import preprocess_criteo, resolve_inputs
from ctrkit.data.sources.table import preprocess_table
from ctrkit.data.storage.agree import Vocabularies, check_same_vocabulary
from ctrkit.data.storage.splits import remove_stale_splits
from ctrkit.data.storage.store import Store, StoreWriter, write_store
from ctrkit.errors import DataError, StoreError
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


# ---- stores and checkpoints agree -------------------------------------------------------------------------
def _criteo_lines(n: int, seed: int, cats: int = 6) -> list[str]:
    """``n`` Criteo TSV rows whose categorical values depend on ``seed`` (other seeds: other vocabularies)."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        ints = [str(int(rng.integers(0, 50))) for _ in range(13)]
        cat = [f"{int(rng.integers(0, cats + j)) + 1000 * seed:08x}" for j in range(26)]
        lines.append("\t".join([str(i % 2), *ints, *cat]))
    return lines


def _tsv(path: Path, lines: list[str], gz: bool = False) -> Path:
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.fixture(scope="module")
def criteo_stores(tmp_path_factory):
    """train/valid/test of one run, a store fitted on other rows, and one mapped with --vocab-from train."""
    d = tmp_path_factory.mktemp("agree")
    run = preprocess_criteo(_tsv(d / "a.tsv", _criteo_lines(200, 0)), d / "run", split="0.6,0.2,0.2", seed=0,
                            embedding_dim=4, progress=False)
    other = preprocess_criteo(_tsv(d / "b.tsv", _criteo_lines(60, 1, cats=3)), d / "other", split="1,0", seed=0,
                              embedding_dim=4, progress=False)["train"]
    mapped = preprocess_criteo(d / "b.tsv", d / "mapped", split="1,0", vocab_from=run["train"], embedding_dim=4,
                               progress=False)["train"]
    return {**run, "other": other, "mapped": mapped}


def test_stores_of_one_run_and_vocab_from_stores_agree(criteo_stores):
    train = criteo_stores["train"]
    for name in ("valid", "test", "mapped", "train"):
        check_same_vocabulary(train, criteo_stores[name], f"data.{name}")
    # the --vocab-from store holds its own copy of the pipeline, with the same per-table fingerprints
    a = json.loads((Path(train) / "pipeline" / "pipeline.json").read_text())
    b = json.loads((Path(criteo_stores["mapped"]) / "pipeline" / "pipeline.json").read_text())
    assert len(a["table_fingerprints"]) == 26 and a["table_fingerprints"] == b["table_fingerprints"]
    assert Vocabularies.of_store(train).differences(Vocabularies.of_store(criteo_stores["mapped"])) == []


def test_a_store_with_other_vocabularies_is_refused(criteo_stores):
    train, other = criteo_stores["train"], criteo_stores["other"]
    with pytest.raises(StoreError) as info:
        check_same_vocabulary(train, other, "data.valid")
    msg = str(info.value)
    assert msg.startswith(f"data.valid: store {other} was preprocessed with other vocabularies than store {train}")
    assert f"`ctrkit preprocess ... --vocab-from {train}`" in msg
    assert "('C1': size 8 vs 5, num_keys 6 vs 3" not in msg  # num_keys is a statistic, not compared
    assert "('C1': size 8 vs 5; 'C2': size 9 vs 6;" in msg and "; and 21 more)" in msg


def test_same_sizes_but_other_keys_is_refused(tmp_path):
    """Two runs whose vocabularies have the same sizes but other keys: only the key digest tells them apart."""
    a = preprocess_criteo(_tsv(tmp_path / "a.tsv", _criteo_lines(400, 0, cats=2)), tmp_path / "a", split="1,0",
                          embedding_dim=4, progress=False)["train"]
    b = preprocess_criteo(_tsv(tmp_path / "b.tsv", _criteo_lines(400, 3, cats=2)), tmp_path / "b", split="1,0",
                          embedding_dim=4, progress=False)["train"]
    assert Store(a).schema.tables() == Store(b).schema.tables()  # same table sizes
    with pytest.raises(StoreError, match=r"'C1': other keys or ids.*--vocab-from"):
        check_same_vocabulary(a, b, "data.test")


def test_checkpoint_vocabularies(criteo_stores):
    """A checkpoint carries the training store's pipeline (its vocabularies and their fingerprints)."""
    from ctrkit.data.pipeline.persist import load_pipeline, to_payload

    train = Store(criteo_stores["train"])
    ref = Vocabularies.of_checkpoint(None, train.schema.to_dict(), "checkpoint best.pt", "data/criteo/train",
                                     pipeline=to_payload(load_pipeline(train.path)))
    check_same_vocabulary(ref, criteo_stores["mapped"], "--data")
    with pytest.raises(StoreError, match=r"--data: store .* than checkpoint best\.pt .*--vocab-from data/criteo/train"):
        check_same_vocabulary(ref, criteo_stores["other"], "--data")
    # no vocabularies in the checkpoint: its schema's table sizes are compared
    sizes_only = Vocabularies.of_checkpoint(None, train.schema, "checkpoint x.pt")
    assert sizes_only.entries is None
    check_same_vocabulary(sizes_only, criteo_stores["valid"], "--data")
    with pytest.raises(StoreError, match=r"table 'C1': size \d+ vs \d+.*--vocab-from <the training store>"):
        check_same_vocabulary(sizes_only, criteo_stores["other"], "--data")


def test_stores_without_vocabularies_compare_table_sizes(tmp_path):
    def store(name: str, vocab: int) -> Path:
        schema = Schema(dense=[DenseFeature("x")], sparse=[SparseFeature("c", vocab, 4)])
        return write_store(tmp_path / name, schema, {"label": np.zeros(3, np.float32), "x": np.zeros(3, np.float32),
                                                     "c": np.zeros(3, np.int32)},
                           {"label": "label", "x": "dense", "c": "sparse"})

    check_same_vocabulary(store("a", 10), store("b", 10), "data.valid")
    with pytest.raises(StoreError, match="table 'c': size 10 vs 11"):
        check_same_vocabulary(store("c", 10), store("d", 11), "data.valid")


def test_overwrite_removes_the_splits_the_new_run_does_not_write(tmp_path):
    raw = _tsv(tmp_path / "a.tsv", _criteo_lines(100, 0))
    first = preprocess_criteo(raw, tmp_path / "out", split="0.8,0.1,0.1", embedding_dim=4, progress=False)
    assert set(first) == {"train", "valid", "test"}
    (tmp_path / "out" / "notes").mkdir()  # not a store: left alone
    second = preprocess_criteo(raw, tmp_path / "out", split="1,0", embedding_dim=4, overwrite=True, progress=False)
    assert set(second) == {"train"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["notes", "train"]
    assert Store(second["train"]).num_rows == 100
    # without --overwrite nothing is touched: the existing train is an error
    with pytest.raises(StoreError, match="already exists"):
        preprocess_criteo(raw, tmp_path / "out", split="1,0", embedding_dim=4, progress=False)


def test_overwrite_removes_stale_splits_of_a_table(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("label,u,x\n" + "".join(f"{i % 2},u{i % 7},{i * 0.5}\n" for i in range(60)))
    spec = tmp_path / "spec.yaml"
    spec.write_text("label: label\ndense: [x]\nsparse: [u]\n")
    first = preprocess_table(csv, spec, tmp_path / "out", split="0.6,0.2,0.2")
    assert set(first) == {"train", "valid", "test"}
    second = preprocess_table(csv, spec, tmp_path / "out", split="0.5,0.5", overwrite=True)  # train, test
    assert set(second) == {"train", "test"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if not p.name.startswith(".")) == ["test", "train"]


def test_remove_stale_splits(tmp_path):
    for name in ("train", "valid", "test"):
        write_store(tmp_path / name, small_schema(), {"label": np.zeros(1, np.float32)}, {"label": "label"})
    assert remove_stale_splits(tmp_path, {"train": tmp_path / "train"}, ("train", "valid", "test")) == [
        tmp_path / "valid", tmp_path / "test"]
    assert [p.name for p in tmp_path.iterdir()] == ["train"]


@pytest.mark.parametrize("names, twin", [(("day_0", "day_1", "day_1.gz"), 1), (("day_0.gz", "day_0", "day_1"), 0)])
def test_a_day_folder_with_plain_and_gzipped_copies_is_refused(tmp_path, names, twin):
    for i, name in enumerate(names):
        _tsv(tmp_path / name, _criteo_lines(20, i), gz=name.endswith(".gz"))
    plain, gz = tmp_path / f"day_{twin}", tmp_path / f"day_{twin}.gz"
    with pytest.raises(DataError) as info:
        resolve_inputs(tmp_path)
    assert str(plain) in str(info.value) and str(gz) in str(info.value) and f"both day {twin}" in str(info.value)
    with pytest.raises(DataError, match=f"both day {twin}"):  # the files given one by one too
        resolve_inputs([tmp_path / "day_0", gz, plain])
    with pytest.raises(DataError, match=f"both day {twin}"):  # and preprocessing stops before reading a row
        preprocess_criteo(tmp_path, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    # one copy per day is fine, in day order
    gz.unlink()
    assert [p.name for p in resolve_inputs(tmp_path)] == sorted(p.name for p in tmp_path.iterdir())
