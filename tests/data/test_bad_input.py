"""Silent-loss paths of preprocessing: non-finite dense values, rows bad for two reasons, byte-order marks,
unknown spec options and gzipped CSV. Each test compares against the same input without the defect."""

from __future__ import annotations

import gzip
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.pipeline.rows import BadRows
from ctrkit.data.sources.criteo import DENSE_NAMES, SPARSE_NAMES, preprocess_criteo
from ctrkit.data.sources.table import load_spec, preprocess_table
from ctrkit.data.storage.store import Store
from ctrkit.errors import DataError

BUNDLED = Path(__file__).resolve().parents[2] / "examples" / "data" / "criteo_sample.tsv.gz"
F32_MAX = float(np.finfo(np.float32).max)
BOM = b"\xef\xbb\xbf"


def criteo_lines(n: int) -> list[str]:
    with gzip.open(BUNDLED, "rt") as f:
        return f.read().splitlines()[:n]


def columns(path: Path) -> dict[str, np.ndarray]:
    """Every column of a store (jagged ones as values and offsets), as numpy arrays."""
    s = Store(path)
    out = {}
    for name in s.columns():
        c = s[name]
        out.update({f"{name}.values": np.asarray(c[0]), f"{name}.offsets": np.asarray(c[1])} if isinstance(c, tuple)
                   else {name: np.asarray(c)})
    return out


def assert_same_store(a: Path, b: Path) -> None:
    ca, cb = columns(a), columns(b)
    assert ca.keys() == cb.keys()
    for k in ca:
        np.testing.assert_array_equal(ca[k], cb[k], err_msg=k)


def assert_dense_finite(path: Path) -> None:
    s = Store(path)
    for name in s.columns("dense"):
        assert np.isfinite(np.asarray(s[name])).all(), name


def reasons(path: Path) -> dict[int, str]:
    return {b["line"]: b["reason"] for b in Store(path).stats["first_bad_lines"]}


# ---- a) non-finite dense values are bad rows ------------------------------------------------------------------
TABLE_SPEC = {"label": "label", "dense": [{"name": "x"}, {"name": "s", "transform": "standardize"},
                                          {"name": "l", "transform": "log"}], "sparse": ["c"]}


def test_non_finite_csv_values_are_bad_rows_and_never_stored(tmp_path: Path) -> None:
    good = [f"{i % 2},{i},{i * 0.5},{i},c{i % 5}" for i in range(100)]
    defects = {  # 0-based position among the data lines -> (line, column named in the reason)
        10: ("1,1e400,1,1,c1", "'x'"), 20: ("0,-1e400,1,1,c1", "'x'"), 30: ("1,1,inf,1,c1", "'s'"),
        40: ("0,1,1,nan,c2", "'l'"), 50: ("1,3.5e38,1,1,c2", "'x'"), 60: ("0,1,1e39,1,c3", "'s'"),
        70: ("1,1,1,1e999,c3", "'l'"),
    }
    lines = list(good)
    for pos, (text, _) in sorted(defects.items()):
        lines.insert(pos, text)
    src = tmp_path / "t.csv"
    src.write_text("label,x,s,l,c\n" + "\n".join(lines) + "\n")
    res = preprocess_table(src, TABLE_SPEC, tmp_path / "o", split="1", max_bad_fraction=0.1)
    s = Store(res["train"])
    assert s.num_rows == 100 and s.stats["bad_rows"] == len(defects)
    got = reasons(res["train"])
    assert sorted(got) == [pos + 2 for pos in defects]  # header is line 1
    for pos, (_, col) in defects.items():
        assert col in got[pos + 2], got[pos + 2]
    assert "not finite" in got[12] and "float32 range" in got[52] and "not a number" in got[42]
    assert_dense_finite(res["train"])
    # the kept rows are exactly the good ones: compare with the file without the defects
    clean = tmp_path / "clean.csv"
    clean.write_text("label,x,s,l,c\n" + "\n".join(good) + "\n")
    want = preprocess_table(clean, TABLE_SPEC, tmp_path / "o2", split="1")
    assert sorted(s["x"].tolist()) == sorted(Store(want["train"])["x"].tolist())
    np.testing.assert_allclose(np.sort(s["s"]), np.sort(Store(want["train"])["s"]), rtol=1e-6)


def test_criteo_field_beyond_float_range_is_a_bad_row_naming_its_column(tmp_path: Path) -> None:
    lines = criteo_lines(200)
    f = lines[0].split("\t")
    bad = ["\t".join([f[0], "1e400", *f[2:]]), "\t".join([f[0], *f[1:4], "inf", *f[5:]]),
           "\t".join([f[0], *f[1:13], "99999999999999999999", *f[14:]])]  # I13: 20 digits
    src = tmp_path / "c.tsv"
    src.write_text("\n".join(lines[:50] + bad + lines[50:]) + "\n")
    res = preprocess_criteo(src, tmp_path / "o", split="1,0,0", max_bad_fraction=0.05, progress=False)
    s = Store(res["train"])
    assert s.num_rows == 200 and s.stats["bad_rows"] == 3
    got = reasons(res["train"])
    assert sorted(got) == [51, 52, 53]
    assert "I1 " in got[51] and "I4 " in got[52] and "I13 " in got[53]
    assert_dense_finite(res["train"])


def test_criteo_pipeline_rows_with_non_finite_text(caplog: pytest.LogCaptureFixture) -> None:
    f = criteo_lines(1)[0].split("\t")
    row = dict(zip(["label", *DENSE_NAMES, *SPARSE_NAMES], f))
    pipe = FeaturePipeline.criteo().fit([row])
    rows = [row, {**row, "I2": "1e400"}, {**row, "I3": "-inf"}, {**row, "I4": "9" * 18}, {**row, "I5": "1e300"}]
    bad = BadRows("rows")
    enc = pipe.encode(rows, bad=bad)
    # Criteo counts follow the block parser's rule (an integer of at most 18 digits): text a file would refuse
    # ("1e400", "-inf", and "1e300", finite but not a count) is a bad row here too
    assert enc.keep.tolist() == [0, 3] and bad.bad == 3
    assert "'I2'" in bad.first[0][1] and "'I3'" in bad.first[1][1] and "'I5'" in bad.first[2][1]
    out = pipe.finalize(enc.parts())
    assert out["I4"][1] == pytest.approx(math.log(1e18 - 1 + 3))  # the largest count: ln keeps it in range
    with pytest.raises(DataError, match=r"row 2: dense 'I2' is not an integer \(optional '-', at most 18 digits\)"):
        pipe.transform(rows)


def test_frames_and_parquet_inf_is_bad_nan_is_missing(tmp_path: Path) -> None:
    spec = {"label": "y", "weight": "w", "dense": [{"name": "x"}], "sparse": ["c"]}
    df = pd.DataFrame({"y": [1, 0, 1, 0, 1], "w": [1.0, 1.0, 1.0, np.inf, 1.0],
                       "x": [1.0, np.nan, np.inf, 2.0, -np.inf], "c": ["a", "b", "a", "b", "a"]})
    pipe = FeaturePipeline.table(spec).fit(df.iloc[[0, 1]])
    bad = BadRows("df")
    enc = pipe.encode(df, bad=bad)
    assert enc.keep.tolist() == [0, 1] and bad.bad == 3  # NaN = missing (0), inf / -inf / inf weight bad
    assert pipe.finalize(enc.parts())["x"].tolist() == [1.0, 0.0]
    assert [n for n, _ in bad.first] == [3, 4, 5] and "weight 'w'" in bad.first[1][1]
    src = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), src)
    res = preprocess_table(src, spec, tmp_path / "o", split="1", max_bad_fraction=1.0)
    assert Store(res["train"]).num_rows == 2 and Store(res["train"]).stats["bad_rows"] == 3
    assert_dense_finite(res["train"])


def test_finalize_saturates_standardized_values_beyond_float32(caplog: pytest.LogCaptureFixture) -> None:
    spec = {"label": "y", "dense": [{"name": "x", "transform": "standardize"}]}
    pipe = FeaturePipeline.table(spec).fit({"y": pa.array([0, 1]), "x": pa.array([1e-150, 2e-150])})  # std 5e-151
    with caplog.at_level(logging.WARNING):
        out = pipe.transform({"y": pa.array([1, 0, 1]), "x": pa.array([1.0, -1.0, 1.5e-150])})
    assert out["x"].tolist() == [F32_MAX, -F32_MAX, 0.0]
    assert "beyond the float32 range" in caplog.text


# ---- b) a row bad for several reasons counts once -------------------------------------------------------------
def test_csv_header_repeated_mid_file_is_one_bad_row(tmp_path: Path) -> None:
    good = [f"{i % 2},{i},{i * 0.5},{i},c{i % 5}" for i in range(60)]
    src = tmp_path / "h.csv"
    src.write_text("label,x,s,l,c\n" + "\n".join(good[:30] + ["label,x,s,l,c"] + good[30:]) + "\n")
    res = preprocess_table(src, TABLE_SPEC, tmp_path / "o", split="1", max_bad_fraction=0.05)
    s = Store(res["train"])
    assert s.num_rows == 60 and s.stats["bad_rows"] == 1 and s.stats["input_rows"] == 61
    (line, reason), = reasons(res["train"]).items()
    assert line == 32 and "label 'label'" in reason and "dense 'x'" in reason and "dense 'l'" in reason
    assert sorted(s["x"].tolist()) == list(range(60))


def test_criteo_header_line_mid_file_is_one_bad_row(tmp_path: Path) -> None:
    lines = criteo_lines(100)
    head = "\t".join(["label", *DENSE_NAMES, *SPARSE_NAMES])
    src = tmp_path / "h.tsv"
    src.write_text("\n".join(lines[:40] + [head] + lines[40:]) + "\n")
    res = preprocess_criteo(src, tmp_path / "o", split="1,0,0", max_bad_fraction=0.05, progress=False)
    s = Store(res["train"])
    assert s.num_rows == 100 and s.stats["bad_rows"] == 1 and list(reasons(res["train"])) == [41]
    plain = tmp_path / "p.tsv"
    plain.write_text("\n".join(lines) + "\n")
    want = Store(preprocess_criteo(plain, tmp_path / "o2", split="1,0,0", progress=False)["train"])
    for c in ("label", *DENSE_NAMES, *SPARSE_NAMES):
        assert sorted(s[c].tolist()) == sorted(want[c].tolist()), c


def test_encode_counts_a_row_once_whatever_its_reasons() -> None:
    spec = {"label": "y", "weight": "w", "split_column": "part", "dense": [{"name": "x"}], "sparse": ["c"]}
    ok = {"y": 1, "w": 1.0, "part": "train", "x": 1.0, "c": "a"}
    pipe = FeaturePipeline.table(spec).fit([ok])
    rows = [ok, {"y": "yes", "w": "heavy", "part": "dev", "x": "1e400", "c": b"\xff".decode("latin1")}, ok]
    bad = BadRows("rows")
    enc = pipe.encode(rows, bad=bad)
    assert bad.bad == 1 and enc.keep.tolist() == [0, 2]
    assert bad.first[0][0] == 2 and all(w in bad.first[0][1] for w in ("label", "weight", "dense 'x'"))


# ---- c) a UTF-8 byte-order mark does not cost the first row ---------------------------------------------------
@pytest.mark.parametrize("gz", [False, True])
def test_criteo_bom_is_stripped(tmp_path: Path, gz: bool) -> None:
    data = ("\n".join(criteo_lines(150)) + "\n").encode()
    paths = []
    for name, body in (("plain", data), ("bom", BOM + data)):
        p = tmp_path / f"{name}.tsv{'.gz' if gz else ''}"
        p.write_bytes(gzip.compress(body) if gz else body)
        paths.append(preprocess_criteo(p, tmp_path / f"o_{name}", progress=False))
    assert paths[0].keys() == paths[1].keys()
    for split in paths[0]:
        assert_same_store(paths[0][split], paths[1][split])
    assert Store(paths[1]["train"]).stats["bad_rows"] == 0


def test_csv_bom_is_stripped(tmp_path: Path) -> None:
    body = "label,x,s,l,c\n" + "\n".join(f"{i % 2},{i},{i},{i},c{i % 3}" for i in range(50)) + "\n"
    plain, bom = tmp_path / "plain.csv", tmp_path / "bom.csv"
    plain.write_bytes(body.encode())
    bom.write_bytes(BOM + body.encode())
    a = preprocess_table(plain, TABLE_SPEC, tmp_path / "a", split="1")["train"]
    b = preprocess_table(bom, TABLE_SPEC, tmp_path / "b", split="1")["train"]
    assert_same_store(a, b)
    assert Store(b).num_rows == 50 and Store(b).stats["bad_rows"] == 0


# ---- d) unknown keys in a table spec -----------------------------------------------------------------------------
def test_unknown_option_and_feature_keys_suggest_the_valid_one(tmp_path: Path) -> None:
    spec = {"label": "y", "sparse": ["c"], "options": {"min_frq": 5}}
    with pytest.raises(DataError, match=r"unknown keys \['min_frq'\] in options; 'min_frq': did you mean 'min_freq'"):
        load_spec(spec)
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump({"label": "y", "dense": [{"name": "x", "transfrom": "log"}]}))
    with pytest.raises(DataError, match=r"spec\.yaml: unknown keys \['transfrom'\] in dense feature 'x'; "
                                        r"'transfrom': did you mean 'transform'"):
        load_spec(f)
    with pytest.raises(DataError, match=r"did you mean 'sparse'"):
        load_spec({"label": "y", "spares": ["c"]})
    with pytest.raises(DataError, match=r"did you mean 'threshold'"):
        load_spec({"label": {"column": "y", "treshold": 4}})
    with pytest.raises(DataError, match="options must be a mapping"):
        load_spec({"label": "y", "options": ["min_freq"]})
    assert load_spec({"label": "y", "options": {"min_freq": 2, "max_vocab": 10, "max_vocab_mode": "cap",
                                                "embedding_dim": 4}}).options["min_freq"] == 2


# ---- e) gzipped CSV -------------------------------------------------------------------------------------------
def test_csv_gz_reads_like_csv(tmp_path: Path) -> None:
    body = "label,x,s,l,c\n" + "\n".join(f"{i % 2},{i},{i * 2},{i},c{i % 7}" for i in range(300)) + "\n1,2\n"
    plain, gz = tmp_path / "t.csv", tmp_path / "t.csv.gz"
    plain.write_text(body)
    gz.write_bytes(gzip.compress(body.encode()))
    a = preprocess_table(plain, TABLE_SPEC, tmp_path / "a", max_bad_fraction=0.01)
    b = preprocess_table(gz, TABLE_SPEC, tmp_path / "b", max_bad_fraction=0.01)
    assert a.keys() == b.keys() == {"train", "valid", "test"}
    for split in a:
        assert_same_store(a[split], b[split])
    assert reasons(b["train"]) == reasons(a["train"]) and list(reasons(b["train"])) == [302]
