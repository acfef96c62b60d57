"""Criteo preprocessing vs a naive pure-Python implementation of seed 000 §3.3, splits and bad input."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from ctrkit.data.pipeline.persist import load_pipeline
from ctrkit.data.sources.criteo import (
    DENSE_NAMES,
    SPARSE_NAMES,
    add_preprocess_criteo_args,
    parse_block,
    preprocess_criteo,
    run_preprocess_criteo,
)
from ctrkit.data.storage.store import Store
from ctrkit.errors import DataError
from tests.conftest import store_rows

# The bundled sample: a copy of shared/data/criteo_dac/criteo_kaggle_merged_unique.tsv.gz (the same bytes), so
# these tests need no shared data and run on every clone.
SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "data" / "criteo_sample.tsv.gz"


def sample_lines(n: int | None = None, start: int = 0) -> list[str]:
    with gzip.open(SAMPLE, "rt") as f:
        lines = f.read().splitlines()
    return lines[start: None if n is None else start + n]


def write(path: Path, lines: list[str], gz: bool = False) -> Path:
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


# ---- naive reference ------------------------------------------------------------------------------------
def reference(lines: list[str], min_freq: int = 1) -> np.ndarray:
    """Rows [n, 40] float64: label, ln(x+3) (clamped at -2), first-appearance ids (0 missing, 1 rare)."""
    counts: list[dict[str, int]] = [{} for _ in range(26)]
    order: list[list[str]] = [[] for _ in range(26)]
    for line in lines:
        f = line.split("\t")
        for j, v in enumerate(f[14:]):
            if v:
                if v not in counts[j]:
                    order[j].append(v)
                counts[j][v] = counts[j].get(v, 0) + 1
    ids = []
    for j in range(26):
        kept = [v for v in order[j] if counts[j][v] >= min_freq]
        ids.append({v: i + 2 for i, v in enumerate(kept)})
    rows = []
    for line in lines:
        f = line.split("\t")
        row = [float(f[0])]
        for v in f[1:14]:
            x = int(v) if v else 0
            row.append(-2.0 if x + 3 <= math.exp(-2) else float(np.float32(max(math.log(x + 3), -2.0))))
        for j, v in enumerate(f[14:]):
            row.append(0 if not v else ids[j].get(v, 1))
        rows.append(row)
    return np.array(rows, dtype=np.float64)


def sort_rows(a: np.ndarray) -> np.ndarray:
    return a[np.lexsort(a.T[::-1])]


# ---- exactness against the reference --------------------------------------------------------------------
def test_matches_naive_reference_on_real_sample(tmp_path: Path) -> None:
    lines = sample_lines(400)
    src = write(tmp_path / "s.tsv.gz", lines, gz=True)
    res = preprocess_criteo(src, tmp_path / "out", split="1,0,0", progress=False)
    assert set(res) == {"train"}
    got, want = store_rows(res["train"]), reference(lines)
    # train is shuffled: same multiset of rows, not the input order
    np.testing.assert_array_equal(sort_rows(got), sort_rows(want))
    assert not np.array_equal(got, want)
    s = Store(res["train"])
    assert s["C1"].dtype == np.int32 and s["I1"].dtype == np.float32 and s["label"].dtype == np.float32
    for c in SPARSE_NAMES:  # vocab sizes: 2 reserved + distinct values
        assert s.schema.feature(c).vocab_size == int(want[:, 14 + SPARSE_NAMES.index(c)].max()) + 1
    assert s.stats["rows"] == 400 and s.stats["bad_rows"] == 0
    assert s.stats["label_rate"] == pytest.approx(want[:, 0].mean())


def test_ratio_split_union_is_input_and_reproducible(tmp_path: Path) -> None:
    lines = sample_lines()
    src = write(tmp_path / "all.tsv", lines)
    a = preprocess_criteo(src, tmp_path / "a", split="0.8,0.1,0.1", seed=3, progress=False)
    b = preprocess_criteo(src, tmp_path / "b", split="0.8,0.1,0.1", seed=3, block_rows=500, progress=False)
    c = preprocess_criteo(src, tmp_path / "c", split="0.8,0.1,0.1", seed=4, progress=False)
    n = len(lines)
    sizes = {k: Store(p).num_rows for k, p in a.items()}
    assert sum(sizes.values()) == n
    for k, frac in (("train", 0.8), ("valid", 0.1), ("test", 0.1)):  # binomial, 5 sigma
        assert abs(sizes[k] - frac * n) < 5 * math.sqrt(n * frac * (1 - frac))
    union = np.concatenate([store_rows(p) for p in a.values()])
    np.testing.assert_array_equal(sort_rows(union), sort_rows(reference(lines)))
    for k in a:  # same seed, different chunking -> identical stores
        np.testing.assert_array_equal(store_rows(a[k]), store_rows(b[k]))
    assert not np.array_equal(store_rows(a["test"])[:50], store_rows(c["test"])[:50])
    # valid/test keep input order: their rows appear in the reference in increasing position
    ref = reference(lines)
    key = {tuple(r): i for i, r in enumerate(ref)}
    pos = [key[tuple(r)] for r in store_rows(a["test"])]
    assert pos == sorted(pos)


def test_in_order_splits_roll_over_small_shards_and_keep_order(tmp_path: Path) -> None:
    """valid / test (and an unshuffled train) spill into shards of bounded size that keep input order,
    so memory does not grow with the split's row count: tiny shards give the same stores as one big one."""
    lines = sample_lines(3000)
    src = write(tmp_path / "s.tsv", lines)
    big = preprocess_criteo(src, tmp_path / "big", split="0.6,0.2,0.2", seed=1, progress=False)
    small = preprocess_criteo(src, tmp_path / "small", split="0.6,0.2,0.2", seed=1, shard_bytes=4_000,
                              progress=False)
    for k in ("valid", "test"):
        np.testing.assert_array_equal(store_rows(big[k]), store_rows(small[k]))
    ordered = preprocess_criteo(src, tmp_path / "ordered", split="1,0", shuffle=False, shard_bytes=4_000,
                                progress=False)
    np.testing.assert_array_equal(store_rows(ordered["train"]), reference(lines))


def test_shard_spill_rolls_over_in_order(tmp_path: Path) -> None:
    from ctrkit.data.pipeline.rows import SpillColumn
    from ctrkit.data.storage.spill import ShardSpill

    spill = ShardSpill(tmp_path / "sp", 1, {"x": SpillColumn("<i8")}, roll_rows=10)
    data = np.arange(47)
    for s in range(0, 47, 7):
        spill.add({"x": data[s:s + 7]})
    shards = list(spill)
    assert len(shards) == 4 and max(spill.rows) <= 10 + 7  # bounded by roll_rows + one chunk
    np.testing.assert_array_equal(np.concatenate([spill.read(i)["x"] for i in shards]), data)


def test_shard_spill_reads_zero_width_columns_shuffled(tmp_path: Path) -> None:
    """A column of zero width per row (a table spec without dense features: dense (n, 0)) has an empty file; a
    shuffled read gives its (n, 0) rows, as the unshuffled read does, beside a permuted column."""
    from ctrkit.data.pipeline.rows import SpillColumn
    from ctrkit.data.storage.spill import ShardSpill

    spill = ShardSpill(tmp_path / "sp", 1, {"dense": SpillColumn("<f4", (0,)), "x": SpillColumn("<i8")})
    spill.add({"dense": np.zeros((9, 0), np.float32), "x": np.arange(9)})
    got = spill.read(0, seed=3)
    assert got["dense"].shape == (9, 0)
    np.testing.assert_array_equal(got["x"], np.arange(9)[np.random.default_rng(3).permutation(9)])


def test_spill_reads_two_dim_columns_as_contiguous_columns(tmp_path: Path) -> None:
    """A 2-d column read back (shuffled or in order, one spill or several parts) holds the rows a[perm] of what was
    added, column by column (each column one contiguous run, what a store writes), across several gather blocks."""
    from ctrkit.data.pipeline.rows import SpillColumn
    from ctrkit.data.storage import spill as sp

    rng = np.random.default_rng(0)
    a = rng.integers(0, 1 << 32, (9000, 26), dtype=np.uint64).astype(np.uint32)
    cols = {"sparse": SpillColumn("<u4", (26,)), "label": SpillColumn("<f4")}
    label = rng.random(9000).astype(np.float32)
    for seed in (None, 5):
        spill = sp.ShardSpill(tmp_path / f"s{seed}", 1, cols)
        for i in range(0, 9000, 1234):
            spill.add({"sparse": np.asfortranarray(a[i:i + 1234]), "label": label[i:i + 1234]})
        perm = np.arange(9000) if seed is None else np.random.default_rng(seed).permutation(9000)
        got = spill.read(0, seed=seed)
        np.testing.assert_array_equal(got["sparse"], a[perm])
        np.testing.assert_array_equal(got["label"], label[perm])
        assert all(got["sparse"][:, j].flags.c_contiguous for j in range(26))
    small = sp._GATHER_BYTES // (26 * 4)  # rows per gather block: 9000 rows span several
    assert 9000 > 3 * small
    parts = []
    for k, (lo, hi) in enumerate(((0, 2000), (2000, 9000))):
        spill = sp.ShardSpill(tmp_path / f"p{k}", 1, cols)
        spill.add({"sparse": a[lo:hi], "label": label[lo:hi]})
        parts.append((spill.dir, hi - lo))
    got = sp.read_parts(parts, 0, cols, seed=9)
    np.testing.assert_array_equal(got["sparse"], a[np.random.default_rng(9).permutation(9000)])


def test_shuffled_train_is_permutation_with_many_shards(tmp_path: Path) -> None:
    lines = sample_lines(2000)
    src = write(tmp_path / "s.tsv", lines)
    res = preprocess_criteo(src, tmp_path / "o", split="1,0,0", shard_bytes=20_000, progress=False)
    got = store_rows(res["train"])
    np.testing.assert_array_equal(sort_rows(got), sort_rows(reference(lines)))
    first_pos = {tuple(r): i for i, r in enumerate(reference(lines))}
    pos = np.array([first_pos[tuple(r)] for r in got])
    assert abs(np.corrcoef(pos, np.arange(len(pos)))[0, 1]) < 0.1  # well mixed


def test_dense_negative_zero_long_and_missing(tmp_path: Path) -> None:
    base = sample_lines(1)[0].split("\t")
    rows = []
    for vals in (["-1", "-2", "-3", "-5", "", "0", "123456789", "99999999", "-12345678901", "7", "", "", "1"],
                 ["12"] * 13):
        rows.append("\t".join([base[0], *vals, *base[14:]]))
    src = write(tmp_path / "d.tsv", rows)
    res = preprocess_criteo(src, tmp_path / "o", split="1,0,0", progress=False)
    s = Store(res["train"])
    got = sort_rows(store_rows(res["train"]))
    np.testing.assert_array_equal(got, sort_rows(reference(rows)))
    assert np.isfinite(got).all()
    clamped = s.stats["clamped_dense"]
    assert clamped["I3"] == 1 and clamped["I4"] == 1 and clamped["I9"] == 1 and clamped["I1"] == 0
    assert sum(clamped.values()) == 3


def test_parse_block_decodes_hex_of_either_case() -> None:
    base = sample_lines(1)[0].split("\t")
    cats = ["0123abcd", "FFFFFFFF", "00000000", "DeadBeef"] + [""] * 22
    blk = parse_block(("\t".join([base[0], *base[1:14], *cats]) + "\r\n").encode())  # CRLF tolerated
    assert blk.keys.shape == (1, 26) and not blk.bad
    assert blk.keys[0, :4].tolist() == [0x0123ABCD, 0xFFFFFFFF, 0, 0xDEADBEEF]
    assert (blk.keys[0, 4:] == -1).all()


def test_parse_block_factorizes_a_key_of_both_cases_as_one() -> None:
    """Categoricals are factorized on their raw bytes, then decoded: one key written in upper and in lower case
    is one distinct key (first appearance of either spelling), with every row's code; a missing field is -1."""
    base = sample_lines(1)[0].split("\t")
    col1 = ["ABCDEF01", "12345678", "abcdef01", "", "AbCdEf01", "12345678"]
    lines = ["\t".join([base[0], *base[1:14], c, *base[15:]]) for c in col1]
    blk = parse_block(("\n".join(lines) + "\n").encode())
    c1 = blk.cat[0]
    assert c1.uniques.tolist() == [0xABCDEF01, 0x12345678, -1] and c1.codes.tolist() == [0, 1, 0, 2, 0, 1]
    assert blk.keys[:, 0].tolist() == [0xABCDEF01, 0x12345678, 0xABCDEF01, -1, 0xABCDEF01, 0x12345678]
    bad = lines[:2] + ["\t".join([base[0], *base[1:14], "abcdefg1", *base[15:]])] + lines[2:]  # 'g': not hex
    blk = parse_block(("\n".join(bad) + "\n").encode())
    assert blk.line.tolist() == [0, 1, 3, 4, 5, 6] and blk.bad[0][0].tolist() == [2] and "C1" in blk.bad[0][1]
    assert blk.cat[0].uniques.tolist() == [0xABCDEF01, 0x12345678, -1]


# ---- vocab options ---------------------------------------------------------------------------------------
def test_min_freq_and_max_vocab(tmp_path: Path) -> None:
    lines = sample_lines(1500)
    src = write(tmp_path / "s.tsv", lines)
    res = preprocess_criteo(src, tmp_path / "mf", split="1,0,0", min_freq=3, progress=False)
    np.testing.assert_array_equal(sort_rows(store_rows(res["train"])), sort_rows(reference(lines, min_freq=3)))

    full = reference(lines)[:, 14:]
    cap = preprocess_criteo(src, tmp_path / "cap", split="1,0,0", max_vocab=50, max_vocab_mode="cap",
                            progress=False)
    want = full.copy()
    want[want >= 50] = 1
    got = store_rows(cap["train"])
    np.testing.assert_array_equal(sort_rows(got[:, 14:]), sort_rows(want))
    assert all(Store(cap["train"]).schema.feature(c).vocab_size <= 50 for c in SPARSE_NAMES)

    hsh = preprocess_criteo(src, tmp_path / "hash", split="1,0,0", max_vocab=50, progress=False)
    s = Store(hsh["train"])
    ids = np.stack([s[c] for c in SPARSE_NAMES], 1)
    assert ids.max() < 50 and s.schema.feature("C3").vocab_size == 50
    assert s.preprocessing["options"]["max_vocab_mode"] == "hash"
    # hashing is a function of the raw value: equal raw values -> equal ids
    raw = np.array([ln.split("\t")[14:] for ln in lines])
    vocabs = load_pipeline(hsh["train"]).vocabs_
    for j in (2, 3, 11):
        col = raw[:, j]
        keys = np.array([int(v, 16) if v else 0 for v in col], np.int64)
        mapped = vocabs[SPARSE_NAMES[j]].lookup(keys, missing=col == "")
        got_col = store_rows(hsh["train"])  # shuffled: compare multisets of (raw, id) pairs
        pairs = {(v, i) for v, i in zip(col, mapped)}
        assert len({v for v, _ in pairs}) == len(pairs)  # one id per raw value
        assert sorted(got_col[:, 14 + j].astype(int).tolist()) == sorted(mapped.tolist())
        # MLPerf's / the DLRM reference's ids: int(hex, 16) % max_vocab, missing 0 (written as "0" there)
        assert mapped.tolist() == [int(v, 16) % 50 if v else 0 for v in col]


def test_vocab_from_maps_unseen_to_one(tmp_path: Path) -> None:
    lines = sample_lines(1000)
    old, new = lines[:600], lines[600:]
    first = preprocess_criteo(write(tmp_path / "a.tsv", old), tmp_path / "a", split="1,0,0", progress=False)
    second = preprocess_criteo(write(tmp_path / "b.tsv", new), tmp_path / "b", split="1,0,0",
                               vocab_from=first["train"], progress=False)
    ref_old = reference(old + new)  # ids of values seen in `old` are the same as fitting on old alone
    want = ref_old[len(old):].copy()
    fitted_old = reference(old)
    for j in range(26):
        limit = fitted_old[:, 14 + j].max()
        col = want[:, 14 + j]
        col[col > limit] = 1  # first seen in `new` -> unseen
    np.testing.assert_array_equal(sort_rows(store_rows(second["train"])), sort_rows(want))
    a, b = Store(first["train"]), Store(second["train"])
    assert [f.vocab_size for f in a.schema.sparse] == [f.vocab_size for f in b.schema.sparse]
    assert (Path(second["train"]) / "pipeline" / "pipeline.json").is_file()
    assert not (Path(second["train"]) / "vocab").exists()  # vocabularies stored once, in the pipeline


# ---- day files -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("valid_from_test", [False, True])
def test_day_files_split(tmp_path: Path, valid_from_test: bool) -> None:
    lines = sample_lines(1200)
    days = [lines[i * 100:(i + 1) * 100] for i in range(12)]
    d = tmp_path / "days"
    d.mkdir()
    for i, chunk in enumerate(days):
        write(d / (f"day_{i}.gz" if i % 2 else f"day_{i}"), chunk, gz=bool(i % 2))
    res = preprocess_criteo(d, tmp_path / "o", valid_from_test=valid_from_test, progress=False)
    ref = reference([ln for chunk in days for ln in chunk])  # vocab fitted over all days in day order
    train = store_rows(res["train"])
    np.testing.assert_array_equal(sort_rows(train), sort_rows(ref[:1100]))
    if valid_from_test:  # torchrec / MLPerf: the last day's first half is valid, its second half test
        assert set(res) == {"train", "valid", "test"}
        np.testing.assert_array_equal(store_rows(res["valid"]), ref[1100:1150])
        np.testing.assert_array_equal(store_rows(res["test"]), ref[1150:])
    else:
        assert set(res) == {"train", "test"}
        np.testing.assert_array_equal(store_rows(res["test"]), ref[1100:])  # test keeps day order
    roles = {Path(i["path"]).name: i["role"] for i in Store(res["train"]).preprocessing["inputs"]}
    assert roles["day_11.gz"] == "test" and roles["day_10"] == "train"


# ---- bad input ---------------------------------------------------------------------------------------------
def _with_bad(tmp_path: Path, bad: dict[int, bytes], n: int = 300) -> tuple[Path, list[str]]:
    lines = sample_lines(n)
    out = [ln.encode() for ln in lines]
    for pos, b in sorted(bad.items()):  # pos = 0-based line index in the final file
        out.insert(pos, b)
    p = tmp_path / "bad.tsv"
    p.write_bytes(b"\n".join(out) + b"\n")
    return p, lines


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda f: "\t".join(f[:30]), "fields"),
        (lambda f: "\t".join([f[0], "abc", *f[2:]]), "dense"),
        (lambda f: "\t".join(["2", *f[1:]]), "label"),
        (lambda f: "\t".join([f[0], *f[1:14], "zz" + f[14][2:], *f[15:]]), "categorical"),
        (lambda f: "\t".join([f[0], *f[1:14], f[14][:7], *f[15:]]), "categorical"),
        (lambda f: "\t".join(f[:40]) + "\t", "fields"),
    ],
)
def test_malformed_rows_are_counted_and_skipped(tmp_path: Path, make, reason: str) -> None:
    base = sample_lines(1)[0].split("\t")
    bad_line = make(base).encode()
    path, lines = _with_bad(tmp_path, {6: bad_line, 150: bad_line})
    res = preprocess_criteo(path, tmp_path / "o", split="1,0,0", max_bad_fraction=0.05, progress=False)
    s = Store(res["train"])
    assert s.num_rows == len(lines)
    np.testing.assert_array_equal(sort_rows(store_rows(res["train"])), sort_rows(reference(lines)))
    assert s.stats["bad_rows"] == 2
    assert [b["line"] for b in s.stats["first_bad_lines"]] == [7, 151]  # 1-based physical lines
    assert reason in s.stats["first_bad_lines"][0]["reason"]


def test_non_utf8_byte_is_skipped_with_line_number(tmp_path: Path) -> None:
    f = sample_lines(1)[0].split("\t")
    bad = "\t".join([f[0], *f[1:14], f[14][:4]]).encode() + b"\xff\xfe\x80\x81\t" + "\t".join(f[15:]).encode()
    path, lines = _with_bad(tmp_path, {41: bad}, n=100)
    res = preprocess_criteo(path, tmp_path / "o", split="1,0,0", max_bad_fraction=0.05, progress=False)
    first = Store(res["train"]).stats["first_bad_lines"]
    assert Store(res["train"]).num_rows == len(lines)
    assert first == [{"file": str(path), "line": 42, "reason": "non-ASCII / non-UTF-8 bytes"}]


def test_too_many_bad_rows_fails_and_leaves_no_store(tmp_path: Path) -> None:
    f = sample_lines(1)[0].split("\t")
    bad = "\t".join(["7", *f[1:]]).encode()
    path, _ = _with_bad(tmp_path, {3: bad, 10: bad, 11: bad}, n=200)
    with pytest.raises(DataError, match=r"bad\.tsv: 3 of 203 rows.*line 4.*line 11.*line 12"):
        preprocess_criteo(path, tmp_path / "o", max_bad_fraction=0.001, progress=False)
    assert not (tmp_path / "o" / "train").exists()
    assert list((tmp_path / "o").iterdir()) == []  # temporary shards removed too


def test_truncated_gzip_empty_and_missing_files(tmp_path: Path) -> None:
    full = gzip.compress(("\n".join(sample_lines(2000)) + "\n").encode())
    trunc = tmp_path / "cut.tsv.gz"
    trunc.write_bytes(full[: len(full) // 2])
    # a damaged gzip keeps its rows before the damage (tests/data/test_criteo_parallel.py checks them)
    res = preprocess_criteo(trunc, tmp_path / "o1", split="1,0,0", progress=False)
    assert Store(res["train"]).preprocessing is not None
    assert Store(res["train"]).manifest["stats"]["damaged_files"][0]["file"] == str(trunc)
    empty = tmp_path / "empty.tsv"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=r"empty\.tsv is empty"):
        preprocess_criteo(empty, tmp_path / "o2", progress=False)
    blank = tmp_path / "blank.tsv.gz"
    blank.write_bytes(gzip.compress(b"\n\n"))
    with pytest.raises(DataError, match=r"blank\.tsv\.gz contains no rows"):
        preprocess_criteo(blank, tmp_path / "o3", progress=False)
    with pytest.raises(DataError, match=r"nope\.tsv does not exist"):
        preprocess_criteo(tmp_path / "nope.tsv", tmp_path / "o4", progress=False)


def test_existing_output_needs_overwrite(tmp_path: Path) -> None:
    src = write(tmp_path / "s.tsv", sample_lines(100))
    preprocess_criteo(src, tmp_path / "o", split="1,0,0", progress=False)
    with pytest.raises(Exception, match="overwrite"):
        preprocess_criteo(src, tmp_path / "o", split="1,0,0", progress=False)
    preprocess_criteo(src, tmp_path / "o", split="1,0,0", min_freq=2, overwrite=True, progress=False)
    assert Store(tmp_path / "o" / "train").preprocessing["options"]["min_freq"] == 2


def test_cli_helpers_and_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command (not preprocess_criteo) keeps freed memory (ctrkit.memory.keep_freed_memory), as `ctrkit train`,
    and turns numpy's huge-page advice off (ctrkit.memory.numpy_huge_pages)."""
    import argparse

    from ctrkit.data.sources import criteo

    calls: list[int] = []
    huge: list[bool] = []
    monkeypatch.setattr(criteo, "keep_freed_memory", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(criteo, "numpy_huge_pages", huge.append)
    src = write(tmp_path / "s.tsv.gz", sample_lines(500), gz=True)
    preprocess_criteo(src, tmp_path / "lib", split="0.9,0.1", progress=False)
    assert calls == []
    p = add_preprocess_criteo_args(argparse.ArgumentParser())
    args = p.parse_args([str(src), "--out", str(tmp_path / "o"), "--min-freq", "2", "--embedding-dim", "8",
                         "--split", "0.9,0.1"])
    assert huge == []
    res = run_preprocess_criteo(args)
    assert calls == [1] and huge == [False]
    assert set(res) == {"train", "test"}
    s = Store(res["train"])
    assert all(f.embedding_dim == 8 for f in s.schema.sparse)
    m = json.loads((res["train"] / "manifest.json").read_text())
    assert m["preprocessing"]["options"]["min_freq"] == 2
    assert set(m["stats"]["clamped_dense"]) == set(DENSE_NAMES)
    assert m["stats"]["input_rows"] == 500


@pytest.mark.parametrize("block_bytes", [1 << 16, 70_001])
def test_plain_blocks_are_the_files_whole_lines(tmp_path: Path, block_bytes: int) -> None:
    """Plain files are read straight into the blocks' padded arrays: the blocks, joined, are the file's text (a BOM
    dropped at its start, a last line without b"\\n" completed), each ends a line, its pad is zero bytes; a line
    longer than a block (and than the 64 KiB searched first for the last line end) and byte ranges of whole lines
    (the tasks' reads) come out the same way."""
    from ctrkit.data.sources.criteo_read import iter_blocks, line_ranges

    rng = np.random.default_rng(3)
    lines = [b"a" * int(n) for n in rng.integers(0, 400, 3000)]
    lines[1000] = b"x" * 200_000
    text = b"\n".join(lines)  # no b"\n" at the end
    for head in (b"", b"\xef\xbb\xbf"):
        p = tmp_path / f"f{len(head)}.tsv"
        p.write_bytes(head + text)
        blocks = [b for b, _ in iter_blocks(p, block_bytes)]
        assert b"".join(b.tobytes() for b in blocks) == text + b"\n"
        assert all(b.tobytes().endswith(b"\n") and not b.buf[b.size:].any() for b in blocks)
        if not head:
            got = [b.tobytes() for a, z in line_ranges(p, 100_000) for b, _ in iter_blocks(p, block_bytes, start=a,
                                                                                          stop=z)]
            assert b"".join(got) == text + b"\n"
