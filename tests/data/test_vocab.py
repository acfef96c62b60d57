"""Streaming first-appearance vocabularies vs a naive dict, options, save/load and lookup."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ctrkit.data.pipeline.vocab import (
    VocabBuilder,
    Vocabulary,
    hash_keys,
    load_vocabularies,
    save_vocabularies,
)
from ctrkit.errors import DataError


def naive_ids(values: list, min_freq: int = 1, missing=(None, "")) -> list[int]:
    counts: dict = {}
    order: list = []
    for v in values:
        if v in missing:
            continue
        if v not in counts:
            order.append(v)
        counts[v] = counts.get(v, 0) + 1
    ids = {v: i + 2 for i, v in enumerate(v for v in order if counts[v] >= min_freq)}
    return [0 if v in missing else ids.get(v, 1) for v in values]


def feed(b: VocabBuilder, values: np.ndarray, chunk: int, missing: np.ndarray | None = None) -> np.ndarray:
    out = []
    for i in range(0, len(values), chunk):
        out.append(b.add(values[i:i + chunk], None if missing is None else missing[i:i + chunk]))
    return np.concatenate(out)


@pytest.mark.parametrize("chunk", [1, 7, 1000, 300_000])
def test_int_first_appearance_across_chunks(chunk: int) -> None:
    rng = np.random.default_rng(0)
    n = 3000 if chunk == 1 else 200_000
    vals = (rng.zipf(1.3, n) * 7919 % 1_000_003).astype(np.int64)
    miss = rng.random(n) < 0.05
    b = VocabBuilder("c", "int")
    pid = feed(b, vals, chunk, miss)
    want = naive_ids([None if m else int(v) for v, m in zip(vals, miss)])
    np.testing.assert_array_equal(pid, want)
    v, lut = b.finish()
    assert lut is None and v.size == max(want) + 1
    np.testing.assert_array_equal(v.lookup(vals, miss), want)  # lookup of fitted data == fitted ids
    assert b.missing == int(miss.sum())


def test_strings_with_nulls_and_empty() -> None:
    vals = ["b", "a", "", "b", None, "c", "a", "é", "ccc"] * 3
    b = VocabBuilder("s", "str")
    pid = np.concatenate([b.add(pa.array(vals[:4])), b.add(pa.array(vals[4:]))])
    want = naive_ids(vals)
    np.testing.assert_array_equal(pid, want)
    v, _ = b.finish()
    assert v.keys.tolist() == ["b", "a", "c", "é", "ccc"]
    np.testing.assert_array_equal(v.lookup(np.array(["ccc", "zzz", "", "a"])), [6, 1, 0, 3])


@pytest.mark.parametrize("min_freq", [2, 3])
def test_min_freq_lut(min_freq: int) -> None:
    rng = np.random.default_rng(1)
    vals = rng.integers(0, 300, 2000)
    b = VocabBuilder("c")
    pid = feed(b, vals, 333)
    v, lut = b.finish(min_freq=min_freq)
    want = naive_ids(vals.tolist(), min_freq)
    np.testing.assert_array_equal(lut[pid], want)
    np.testing.assert_array_equal(v.lookup(vals), want)
    assert v.size == max(want) + 1


def test_cap_and_hash_modes() -> None:
    vals = np.arange(100) * 13 % 97
    b = VocabBuilder("c")
    pid = b.add(vals)
    cap, lut = b.finish(max_vocab=10, mode="cap")
    full = np.array(naive_ids(vals.tolist()))
    want = np.where(full >= 10, 1, full)
    np.testing.assert_array_equal(lut[pid], want)
    np.testing.assert_array_equal(cap.lookup(vals), want)
    assert cap.size == 10
    hsh, lut = b.finish(max_vocab=10, mode="hash")
    ids = lut[pid]
    assert ids.min() >= 2 and ids.max() < 10 and hsh.size == 10
    expect = 2 + (hash_keys(vals) % np.uint64(8)).astype(np.int64)
    np.testing.assert_array_equal(ids, expect)
    np.testing.assert_array_equal(hsh.lookup(np.array([5, 10_000])), [expect[vals == 5][0], 1])


def test_hash_of_strings_is_deterministic_and_spreads() -> None:
    keys = np.array([f"user{i}" for i in range(2000)])
    h1, h2 = hash_keys(keys), hash_keys(keys.copy())
    np.testing.assert_array_equal(h1, h2)
    assert len(np.unique(h1)) == 2000
    counts = np.bincount((h1 % np.uint64(10)).astype(int), minlength=10)
    assert counts.min() > 120


def test_save_load_roundtrip(tmp_path: Path) -> None:
    b1, b2 = VocabBuilder("i", "int"), VocabBuilder("s", "str")
    b1.add(np.array([5, 3, 5, 2**40, 7]))
    b2.add(np.array(["x", "y", "x", "zz"]))
    v1, _ = b1.finish()
    v2, _ = b2.finish(max_vocab=5, mode="hash")
    save_vocabularies(tmp_path / "vocab", {"i": v1, "s": v2}, note="t")
    back = load_vocabularies(tmp_path)
    assert set(back) == {"i", "s"}
    for v in (v1, v2):
        w = back[v.name]
        assert w.size == v.size and w.mode == v.mode and w.kind == v.kind
        np.testing.assert_array_equal(w.keys, v.keys)
        np.testing.assert_array_equal(w.ids, v.ids)
        np.testing.assert_array_equal(w.counts, v.counts)
    np.testing.assert_array_equal(back["i"].lookup(np.array([2**40, 4, 3])), [4, 1, 3])
    np.testing.assert_array_equal(back["s"].lookup(np.array(["zz", "q"])), [v2.lookup(np.array(["zz"]))[0], 1])


def test_bad_options_and_missing_dir(tmp_path: Path) -> None:
    b = VocabBuilder("c")
    b.add(np.array([1, 2]))
    with pytest.raises(DataError, match="min_freq"):
        b.finish(min_freq=0)
    with pytest.raises(DataError, match="max_vocab"):
        b.finish(max_vocab=2)
    with pytest.raises(DataError, match="mode"):
        b.finish(max_vocab=10, mode="modulo")
    with pytest.raises(DataError, match="no vocabularies"):
        load_vocabularies(tmp_path)
    assert isinstance(Vocabulary.build("x", "int", np.array([9]), np.array([1])).lookup(np.array([9]))[0],
                      np.integer)


def test_unseen_base_keeps_distinct_unseen_keys_apart():
    from ctrkit.data.pipeline.vocab import RARE_ID

    v = Vocabulary.build("g", "str", np.array(["a", "b"]), np.array([1, 1]))
    values = pa.array(["a", "x", "y", "x", None, "b"])
    plain = v.lookup(values)
    assert plain.tolist() == [2, RARE_ID, RARE_ID, RARE_ID, 0, 3]
    apart = v.lookup(values, unseen_base=1 << 62)
    want = [(1 << 62) + int(h >> np.uint64(2)) for h in hash_keys(np.array(["x", "y", "x"]))]
    assert apart.tolist() == [2, want[0], want[1], want[2], 0, 3]
    assert apart[1] == apart[3] != apart[2]
    ints = Vocabulary.build("g", "int", np.array([5, 6]), np.array([1, 1]))
    got = ints.lookup(pa.array(["5", "7", "abc", ""]), unseen_base=1 << 62)
    assert got[0] == 2 and got[1] >= 1 << 62 and got[2] == RARE_ID and got[3] == 0


def test_chunked_keys_encode_as_one_array():
    """pyarrow may return a ChunkedArray for many strings; the vocabulary sees one array (one dictionary)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from ctrkit.data.pipeline.vocab import _one_chunk

    chunked = pa.chunked_array([["a", "b"], ["b", "c", "a"]])
    enc = pc.dictionary_encode(_one_chunk(chunked))
    assert enc.dictionary.to_pylist() == ["a", "b", "c"] and enc.indices.to_pylist() == [0, 1, 1, 2, 0]
    assert _one_chunk(pa.array([1, 2])).to_pylist() == [1, 2]


def test_hash_index_matches_a_dict_across_inserts():
    """The integer vocabularies' index (pandas' hash table) against a dict: any int64 key, batches of inserts."""
    from ctrkit.data.pipeline.vocab_index import HashIndex

    rng = np.random.default_rng(0)
    idx, ref = HashIndex(), {}
    edge = np.array([0, -1, 1, np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0xFFFFFFFF], np.int64)
    for step in range(20):
        keys = np.concatenate([edge, rng.integers(-(1 << 40), 1 << 40, 500), rng.integers(0, 300, 500)])
        got = idx.get(keys)
        assert got.tolist() == [ref.get(int(k), -1) for k in keys]
        new = np.unique(keys[got < 0])
        vals = 1000 * step + np.arange(len(new))
        idx.insert(new, vals)
        ref.update(zip(new.tolist(), vals.tolist()))
        assert len(idx) == len(ref) and idx.nbytes > 0


def test_factorized_keys_count_and_look_up_as_their_rows():
    """CodedKeys (the Criteo parser's factorized columns: codes into first-appearance distinct keys, negative =
    missing) give the ids, counts and missing count of the same keys fed row by row, against the naive dict."""
    import pandas as pd

    from ctrkit.data.pipeline.vocab_keys import CodedKeys

    rng = np.random.default_rng(1)
    vals = (rng.zipf(1.4, 20_000) % 5003).astype(np.int64)
    vals[rng.random(len(vals)) < 0.1] = -1  # missing
    plain, coded = VocabBuilder("p", "int"), VocabBuilder("c", "int")
    got, want = [], []
    for i in range(0, len(vals), 1500):
        part = vals[i:i + 1500]
        codes, uniq = pd.factorize(part)
        got.append(coded.add(CodedKeys(codes, uniq)))
        want.append(plain.add(part, part < 0))
    got_ids = np.concatenate(got)
    np.testing.assert_array_equal(got_ids, np.concatenate(want))
    np.testing.assert_array_equal(got_ids, naive_ids([None if v < 0 else int(v) for v in vals]))
    np.testing.assert_array_equal(coded.keys(), plain.keys())
    np.testing.assert_array_equal(coded.counts(), plain.counts())
    assert coded.missing == plain.missing == int((vals < 0).sum())
    for min_freq in (1, 3):
        v, _ = plain.finish(min_freq)
        probe = np.concatenate([vals[:3000], [123_456_789, -1]])  # an unseen key, a missing one
        codes, uniq = pd.factorize(probe)
        np.testing.assert_array_equal(v.lookup(CodedKeys(codes, uniq)), v.lookup(probe, probe < 0))
    mod = Vocabulary.modulo("m", 1000)  # MLPerf's keyless ids: key % 1000, missing 0
    np.testing.assert_array_equal(mod.lookup(CodedKeys(codes, uniq)), np.where(probe < 0, 0, probe % 1000))


def test_encoders_give_factorized_columns_the_ids_of_their_rows():
    """The fitter and the fitted Criteo pipeline gather a factorized column's ids from its distinct keys' ids
    (RowEncoder._coded_ids) into the sparse block: the same ids as the plain keys of every row give."""
    import pandas as pd

    from ctrkit.data.pipeline.feature_pipeline import DENSE_NAMES, SPARSE_NAMES, FeaturePipeline
    from ctrkit.data.pipeline.vocab_keys import CodedKeys

    rng = np.random.default_rng(2)

    def chunk(n: int, coded: bool, seed: int) -> dict:
        r = np.random.default_rng(seed)
        cols: dict = {"label": (r.random(n) < 0.3).astype(np.float32)}
        cols.update((c, r.integers(0, 50, n)) for c in DENSE_NAMES)
        for c in SPARSE_NAMES:
            keys = (r.zipf(1.3, n) % 997).astype(np.int64)
            keys[r.random(n) < 0.1] = -1
            if coded:
                codes, uniq = pd.factorize(keys)
                cols[c] = CodedKeys(codes, uniq)
            else:
                cols[c] = keys
        return cols

    seeds = rng.integers(0, 1 << 30, 4).tolist()
    fits = [FeaturePipeline.criteo().fitter() for _ in range(2)]
    for s in seeds:
        a, b = (f.encode(chunk(700, coded, s)) for f, coded in zip(fits, (True, False)))
        np.testing.assert_array_equal(a.sparse, b.sparse)
    pipes = [f.finish() for f in fits]
    for s in (7, 8):  # unseen keys (1) and missing ones (0) among them
        a, b = (p.encode(chunk(500, coded, s)) for p, coded in zip(pipes, (True, False)))
        np.testing.assert_array_equal(a.sparse, b.sparse)
        assert (a.sparse == 0).any() and a.sparse.dtype == np.uint32
