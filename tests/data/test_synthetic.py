import argparse

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from ctrkit.cli import main
from ctrkit.data.sources.synthetic import (
    DENSE_NAMES,
    KAGGLE_CARDINALITIES,
    SPARSE_NAMES,
    add_synth_args,
    output_format,
    run_synth,
    scaled_cardinalities,
    synthetic_arrays,
    write_criteo_tsv,
    write_synthetic_store,
    zipf_ids,
)
from ctrkit.data.storage.store import Store


def read_tsv(path):
    names = ["label", *DENSE_NAMES, *SPARSE_NAMES]
    types = {n: pa.string() for n in SPARSE_NAMES}
    types.update({n: pa.int64() for n in ["label", *DENSE_NAMES]})
    return pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(column_names=names),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True, null_values=[""]),
    )


def test_kaggle_cardinalities():
    assert len(KAGGLE_CARDINALITIES) == 26 and sum(KAGGLE_CARDINALITIES) == 33762577
    assert scaled_cardinalities(0.001)[2] == 10131 and min(scaled_cardinalities(1e-9)) == 2
    assert max(scaled_cardinalities(max_cardinality=1000)) == 1000
    with pytest.raises(ValueError):
        scaled_cardinalities(0)


def test_zipf_range_and_skew():
    rng = np.random.default_rng(0)
    cards = np.array([3, 100, 10**7])
    r = zipf_ids(rng, 200_000, cards)
    assert r.min() >= 0 and (r.max(0) < cards).all()
    counts = np.bincount(r[:, 1], minlength=100)
    assert counts[0] > counts[10] > counts[90]  # decreasing frequency with rank


def test_store_matches_arrays_and_tsv(tmp_path):
    kw = {"seed": 3, "scale": 1e-3, "chunk_rows": 700}
    n = 2000
    dense, sparse, labels = synthetic_arrays(n, 3, scaled_cardinalities(1e-3), chunk_rows=700)
    write_synthetic_store(tmp_path / "s", n, **kw)
    write_criteo_tsv(tmp_path / "raw.tsv.gz", n, **kw)
    s = Store(tmp_path / "s")
    assert s.num_rows == n and s.schema.sparse[2].vocab_size == 10131
    np.testing.assert_array_equal(s["label"], labels)
    np.testing.assert_array_equal(np.stack([s[c] for c in DENSE_NAMES], 1), dense)
    np.testing.assert_array_equal(np.stack([s[c] for c in SPARSE_NAMES], 1), sparse)
    assert s["C1"].dtype == np.int32
    for f, c in enumerate(SPARSE_NAMES):
        assert sparse[:, f].max() < s.schema.sparse[f].vocab_size
    t = read_tsv(tmp_path / "raw.tsv.gz")
    assert t.num_rows == n
    np.testing.assert_array_equal(t["label"].to_numpy(), labels)
    for j, c in enumerate(DENSE_NAMES):  # dense = ln(x + 3), missing -> 0 (seed 000 §3.3)
        x = t[c].to_numpy(zero_copy_only=False)
        x = np.where(np.isnan(x.astype(float)), 0, x).astype(float)
        np.testing.assert_allclose(np.log(x + 3).astype(np.float32), dense[:, j])
    assert 0.03 < np.mean([t[c].null_count for c in DENSE_NAMES]) / n < 0.2
    for f, c in enumerate(SPARSE_NAMES):  # hex strings are a bijection of the ids (missing -> '' / 0)
        col = t[c].to_pylist()
        assert all(v is None or (len(v) == 8 and int(v, 16) >= 0) for v in col)
        pairs = {(v, int(i)) for v, i in zip(col, sparse[:, f]) if v is not None}
        assert len({v for v, _ in pairs}) == len(pairs) == len({i for _, i in pairs})
        assert all(sparse[r, f] == 0 for r, v in enumerate(col) if v is None)


def test_planted_signal_is_learnable():
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    cards = scaled_cardinalities(max_cardinality=200)
    d0, s0, y0 = synthetic_arrays(30_000, 0, cards)
    d1, s1, y1 = synthetic_arrays(20_000, 1, cards)
    assert 0.15 < y0.mean() < 0.35

    def feats(d, s):  # dense + one-hot of a few low-cardinality categorical columns
        onehots = [np.eye(cards[f], dtype=np.float32)[s[:, f]] for f in (0, 1, 5, 8, 13, 2)]
        return np.concatenate([d, *onehots], 1)

    m = LogisticRegression(solver="liblinear").fit(feats(d0, s0), y0)
    auc = roc_auc_score(y1, m.predict_proba(feats(d1, s1))[:, 1])
    assert auc > 0.7
    np.testing.assert_array_equal(synthetic_arrays(30_000, 0, cards)[1], s0)  # seeded


def test_cli_helpers(tmp_path):
    p = add_synth_args(argparse.ArgumentParser())
    args = p.parse_args(["--rows", "50", "--out", str(tmp_path / "x.tsv"), "--format", "tsv", "--scale", "0.01"])
    run_synth(args)
    assert read_tsv(tmp_path / "x.tsv").num_rows == 50
    args = p.parse_args(["--rows", "50", "--out", str(tmp_path / "st"), "--max-cardinality", "100"])
    run_synth(args)
    assert Store(tmp_path / "st").schema.sparse[2].vocab_size == 100
    # the format follows the output name when --format is not given
    run_synth(p.parse_args(["--rows", "20", "--out", str(tmp_path / "y.tsv.gz"), "--scale", "0.01"]))
    assert read_tsv(tmp_path / "y.tsv.gz").num_rows == 20


@pytest.mark.parametrize("name", ["day_0.gz", "y.tsv.gz", "y.tsv"])
def test_synth_out_with_a_tsv_suffix_writes_criteo_tsv(tmp_path, name):
    """`ctrkit synth --out day_0.gz` writes a gzip TSV like Criteo's day files, not a store named day_0.gz."""
    assert main(["synth", "--rows", "30", "--out", str(tmp_path / name), "--scale", "0.01"]) == 0
    out = tmp_path / name
    assert out.is_file() and (out.read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")  # gzip magic
    assert read_tsv(out).num_rows == 30
    assert output_format(out) == "tsv" and output_format(tmp_path / "day_0") == "store"
    assert main(["synth", "--rows", "30", "--out", str(tmp_path / "st.gz"), "--format", "store",
                 "--scale", "0.01"]) == 0
    assert Store(tmp_path / "st.gz").num_rows == 30  # --format still decides when given
