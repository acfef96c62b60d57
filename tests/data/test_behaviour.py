"""Behaviour-log builder: hand-written samples of tiny logs, a naive per-user reference on a Taobao slice,
negatives, DIEN's aux negatives, DSIN's sessions, S3-Rec input, stores that the pipeline and loader read, and
the retrieval options (positives-only samples, YouTubeDNN's example age)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from behaviour_rows import decode, rows_of

from ctrkit.batch import Batch
from ctrkit.cli import main
from ctrkit.data.pipeline.persist import load_pipeline
from ctrkit.data.sources.behaviour import preprocess_behaviour, read_behaviour_log
from ctrkit.data.sources.behaviour_samples import (
    build_samples,
    draw_negatives,
    example_ages,
    sort_log,
    user_keys,
)
from ctrkit.data.sources.raw_rows import iter_transformed
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store
from ctrkit.errors import DataError, StoreError

# user A: 5 behaviours in order; B: one; C: 3, its first two rows out of time order in the file
TINY = """user,item,category,time
A,a1,x,10
A,a2,x,20
B,b1,y,5
C,c2,z,200
A,a3,y,30
C,c1,z,100
A,a4,x,40
A,a5,y,50
C,c3,x,300
"""


def tiny(tmp_path: Path, text: str = TINY, name: str = "log.csv") -> Path:
    p = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(p, "wt") as f:
            f.write(text)
    else:
        p.write_text(text)
    return p


def test_tiny_log_samples_by_hand(tmp_path: Path) -> None:
    res = preprocess_behaviour(tiny(tmp_path, name="log.csv.gz"), tmp_path / "out", attr_cols=["category:cate"],
                               time_col="time", seed=3)
    tr, va, te = (Store(res[s]) for s in ("train", "valid", "test"))
    pos = lambda st: [r for r in rows_of(st) if r[1] == 1]
    assert sorted(pos(tr)) == [("A", 1, "a2", ("a1",)), ("A", 1, "a3", ("a1", "a2"))]
    known = {k for r in rows_of(tr) for k in (r[0], r[2], *r[3])}  # the train rows' keys: all else is rare
    assert known >= {"A", "a1", "a2", "a3"} and not known & {"a4", "a5", "C"}
    vocab = lambda *keys: tuple(k if k in known else "RARE" for k in keys)
    # valid / test keep user order; C's file rows c2@200, c1@100 are sorted by time
    assert pos(va) == [("A", 1, "RARE", ("a1", "a2", "a3")), ("RARE", 1, *vocab("c2"), vocab("c1"))]
    assert pos(te) == [("A", 1, "RARE", ("a1", "a2", "a3", "RARE")), ("RARE", 1, *vocab("c3"), vocab("c1", "c2"))]
    # every positive is followed by a negative with the same history and an item the user never had
    items = {"A": {"a1", "a2", "a3", "a4", "a5"}, "C": {"c1", "c2", "c3"}}
    for st in (va, te):
        r = rows_of(st)
        assert [x[1] for x in r] == [1, 0] * (len(r) // 2)
        for p, n in zip(r[::2], r[1::2]):
            assert n[0] == p[0] and n[3] == p[3] and n[2] not in items.get(p[0], items["C"])
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["single_behaviour_users"] == 1 and rep["out_of_order_rows"] == 1 and rep["users"] == 3
    assert rep["samples"] == {"train": 4, "valid": 4, "test": 4} and rep["behaviours"] == 9
    assert tr.stats["behaviour"]["samples"] == rep["samples"] and tr.schema.group_id == "group"
    assert rep["cold_positives"] == {"valid": 2, "test": 2}  # a4, c2 / a5, c3 are in no train positive
    # categories follow the items (first row's value), histories of attributes share the cate table
    assert decode(te, "hist_cate")[0] == ["x", "x", "y", "x"] and decode(te, "cate")[0] == "y"
    # A was seen in train; C, only in valid / test, gets a GAUC group of its own: an id of the group vocabulary,
    # so its key stays known (recall names it), not a hashed unseen id (>= 2^62)
    assert te["group"][0] != te["group"][2] and max(te["group"][0], te["group"][2]) < 1 << 62
    seq = {q.name: q for q in te.schema.sequence}
    assert seq["hist_item"].shares == "item" and seq["hist_cate"].shares == "cate"
    assert seq["hist_item"].pooling == "none" and seq["hist_item"].max_len == 50


def test_vocabularies_fitted_on_train_only(tmp_path: Path) -> None:
    res = preprocess_behaviour(tiny(tmp_path), tmp_path / "out", time_col="time", seed=0)
    tr, va = Store(res["train"]), Store(res["valid"])
    pipe = load_pipeline(tr.path / "pipeline")
    train_items = {k for r in rows_of(tr) for k in (r[2], *r[3])}
    assert set(pipe.vocabs_["item"].keys.tolist()) == train_items  # exactly the train rows' keys
    assert set(pipe.vocabs_["user"].keys.tolist()) == {"A"}  # C only has valid / test samples
    assert decode(va, "item")[2] == ("c2" if "c2" in train_items else "RARE")  # C's valid positive
    assert va["user"][2] == 1  # unseen user: the rare id as a feature; its own GAUC group, with its key
    group = pipe.vocabs_["__group__"]
    assert va["group"][2] == group.ids[group.keys.tolist().index("C")]


def test_max_len_keeps_most_recent(tmp_path: Path) -> None:
    res = preprocess_behaviour(tiny(tmp_path), tmp_path / "out", time_col="time", max_len=2)
    te = Store(res["test"])
    assert rows_of(te)[0] == ("A", 1, "RARE", ("a3", "RARE"))  # a4, a5 are in no train row
    assert {q.name: q.max_len for q in te.schema.sequence}["hist_item"] == 2


def test_file_order_without_time_and_parquet(tmp_path: Path) -> None:
    p = tmp_path / "log.parquet"
    pq.write_table(pa.table({"uid": [7, 7, 7, 7, 8, 8], "iid": [3, 1, 2, 9, 1, 4]}), p)
    res = preprocess_behaviour(p, tmp_path / "out", user_col="uid", item_col="iid", seed=1)
    te = Store(res["test"])
    assert [r for r in rows_of(te) if r[1] == 1] == [(7, 1, "RARE", (3, 1, "RARE")), ("RARE", 1, 4, (1,))]
    assert [r for r in rows_of(Store(res["train"])) if r[1] == 1] == [(7, 1, 1, (3,))]
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["out_of_order_rows"] == 0 and rep["format"] == "parquet"


def _naive(path: Path, n_lines: int, max_len: int) -> dict[str, list[tuple]]:
    """Per-user Python reference: sort by time (stable), one positive per behaviour after the first."""
    by_user: dict[str, list[tuple[int, int, str]]] = {}
    with gzip.open(path, "rt") as f:
        for j, line in zip(range(n_lines), f):
            u, i, _c, _b, t = line.strip().split(",")
            by_user.setdefault(u, []).append((int(t), j, i))
    out: dict[str, list[tuple]] = {"train": [], "valid": [], "test": []}
    for u, rows in by_user.items():
        items = [i for _t, _j, i in sorted(rows)]
        for p in range(1, len(items)):
            split = "test" if p == len(items) - 1 else "valid" if p == len(items) - 2 else "train"
            out[split].append((int(u), items[p], tuple(int(x) for x in items[max(0, p - max_len):p])))
    return out


def test_taobao_slice_matches_naive_reference(tmp_path: Path, shared_data) -> None:
    with gzip.open(shared_data("taobao_userbehavior/UserBehavior_head.csv.gz"), "rt") as f:
        lines = f.readlines()[:3000]
    src = tmp_path / "ub.csv.gz"
    with gzip.open(src, "wt") as f:
        f.writelines(lines)
    assert main(["preprocess", "behaviour", "--input", str(src), "--out", str(tmp_path / "out"), "--no-header",
                 "--names", "user,item,category,type,timestamp", "--attr-cols", "category:cate", "--time-col",
                 "timestamp", "--max-len", "7"]) == 0
    want = _naive(src, 3000, 7)
    for split in ("valid", "test"):  # items of valid / test are raw keys when train saw them, else rare
        st = Store(tmp_path / "out" / split)
        got = [(r[0], r[2], r[3]) for r in rows_of(st) if r[1] == 1]
        assert len(got) == len(want[split])
        for g, w in zip(got, want[split]):
            assert g[0] in (w[0], "RARE") and g[1] in (int(w[1]), "RARE")
            assert all(a in (b, "RARE") for a, b in zip(g[2], w[2])) and len(g[2]) == len(w[2])
    tr = Store(tmp_path / "out" / "train")
    got = sorted((r[0], r[2], r[3]) for r in rows_of(tr) if r[1] == 1)
    assert got == sorted((u, int(i), h) for u, i, h in want["train"])
    assert (tmp_path / "out" / "report.json").is_file()


def test_sessions_by_hand() -> None:
    # one user, gap 1800: sessions [0, 100] [5000, 5100, 5200] [20000, 20100]
    t = np.array([0, 100, 5000, 5100, 5200, 20000, 20100], np.float64)
    u, it = np.zeros(7, np.int64), np.arange(7)

    def slots(min_len: int) -> list[list[list[int]]]:
        s = build_samples(u, it, t, n_items=20, sessions=2, session_len=2, min_session_len=min_len)
        pos = np.flatnonzero(s.label == 1)
        pos = pos[np.argsort(s.item[pos])]  # positives by target (item code = row), train rows are shuffled
        out = []
        for v, ln in s.sessions:
            off = np.concatenate([[0], np.cumsum(ln)])
            out.append([v[off[r]:off[r + 1]].tolist() for r in pos])
        return [list(x) for x in zip(*out)]  # per sample: [slot0, slot1]

    got = slots(1)  # targets are rows 1..6
    assert got[0] == [[0], []]  # history [0]: one cut session, left-aligned
    assert got[1] == [[0, 1], []]  # target 5000 opens a session: [0, 100] is complete
    assert got[2] == [[0, 1], [2]]  # the second session cut at the target
    assert got[3] == [[0, 1], [2, 3]]
    assert got[4] == [[0, 1], [3, 4]]  # target 20000 opens a new session; [5000..5200] keeps its last 2
    assert got[5] == [[3, 4], [5]]  # most recent 2 sessions: [.., 5100, 5200], the cut [20000]
    got = slots(2)  # sessions shorter than 2 dropped (the cut one included)
    assert got[0] == [[], []] and got[1] == [[0, 1], []] and got[2] == [[0, 1], []]
    assert got[3] == [[0, 1], [2, 3]] and got[4] == [[0, 1], [3, 4]] and got[5] == [[0, 1], [3, 4]]
    with pytest.raises(DataError, match="timestamps"):
        build_samples(u, it, None, n_items=20, sessions=2)


def test_aux_negatives_and_seeds() -> None:
    rng = np.random.default_rng(0)
    n_users, n_items = 30, 40
    u = np.sort(rng.integers(0, n_users, 600))
    it = rng.integers(0, n_items, 600)
    t = rng.random(600)
    order, _ = sort_log(u, t)
    s = build_samples(u[order], it[order], t[order], n_items=n_items, aux_negatives=True, seed=5)
    seen = {(a, b) for a, b in zip(u.tolist(), it.tolist())}
    assert np.array_equal(s.neg_hist[1], s.hist[1])
    users = np.repeat(s.user, s.hist[1])
    assert not any((a, b) in seen for a, b in zip(users.tolist(), s.neg_hist[0].tolist()))
    neg = s.label == 0
    assert not any((a, b) in seen for a, b in zip(s.user[neg].tolist(), s.item[neg].tolist()))
    again = build_samples(u[order], it[order], t[order], n_items=n_items, aux_negatives=True, seed=5)
    other = build_samples(u[order], it[order], t[order], n_items=n_items, aux_negatives=True, seed=6)
    assert np.array_equal(s.item, again.item) and np.array_equal(s.neg_hist[0], again.neg_hist[0])
    assert not np.array_equal(s.item, other.item)


def test_negative_sampling_distributions() -> None:
    rng = np.random.default_rng(0)
    n_items = 6
    pool = np.repeat(np.arange(n_items), [1, 2, 3, 4, 5, 15])  # frequencies of the log's items
    seen = user_keys(np.array([0]), np.array([5]), n_items)  # user 0 has item 5
    pop = draw_negatives(np.zeros(200_000, np.int64), seen, n_items, rng, pool)
    freq = np.bincount(pop, minlength=n_items) / len(pop)
    want = np.array([1, 2, 3, 4, 5, 0]) / 15
    assert np.abs(freq - want).max() < 0.005
    uni = draw_negatives(np.zeros(200_000, np.int64), seen, n_items, rng)
    assert np.abs(np.bincount(uni, minlength=n_items) / len(uni) - np.array([.2] * 5 + [0])).max() < 0.005
    with pytest.raises(DataError, match="all 2 items"):
        build_samples(np.zeros(3, np.int64), np.array([0, 1, 0]), None, n_items=2)


def test_overwrite_refused_and_seeded_stores(tmp_path: Path) -> None:
    p = tiny(tmp_path)
    preprocess_behaviour(p, tmp_path / "out", time_col="time", seed=2)
    first = Store(tmp_path / "out" / "train")["item"].copy()
    with pytest.raises(StoreError, match="--overwrite"):
        preprocess_behaviour(p, tmp_path / "out", time_col="time", seed=2)
    assert main(["preprocess", "behaviour", str(p), "--out", str(tmp_path / "out"), "--time-col", "time",
                 "--seed", "2"]) == 2
    preprocess_behaviour(p, tmp_path / "out", time_col="time", seed=2, overwrite=True)
    assert np.array_equal(Store(tmp_path / "out" / "train")["item"], first)


def test_s3rec_with_attributes(tmp_path: Path) -> None:
    seq = tmp_path / "seq.txt.gz"
    with gzip.open(seq, "wt") as f:
        f.write("1 10 11 12 13\n2 11 14\n\n3 12\n")
    attrs = tmp_path / "attrs.json.gz"
    with gzip.open(attrs, "wt") as f:
        json.dump({"10": [100, 7], "11": [101, 8, 9], "12": [5], "13": []}, f)
    res = preprocess_behaviour(seq, tmp_path / "out", format="s3rec", item_attributes=attrs)
    te = Store(res["test"])
    # train: user 1's target 11 (history [10]) and its negative, necessarily 14 (1 had 10..13)
    tr = Store(res["train"])
    assert sorted(rows_of(tr, ("user", "label", "item", "hist_item", "hist_cate", "cate")), key=lambda r: -r[1]) == [
        (1, 1, 11, (10,), (7,), 9), (1, 0, 14, (10,), (7,), None)]  # cate = the last attribute; 14 has none
    assert rows_of(te, ("user", "label", "item", "hist_item", "hist_cate"))[0] == (
        1, 1, "RARE", (10, 11, "RARE"), (7, 9, "RARE"))  # 12, 13 and 12's cate 5 are in no train row
    assert decode(te, "cate")[0] is None  # item 13 has no attribute: missing (id 0)
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["single_behaviour_users"] == 1 and rep["items_without_attributes"] == 2  # 13 ([]), 14 (absent)
    assert rep["empty_lines"] == 1 and rep["samples"]["test"] == 4
    log = read_behaviour_log(seq, format="s3rec")
    assert log.time is None and len(log.item) == 7


def test_store_to_batch_and_loader(tmp_path: Path) -> None:
    res = preprocess_behaviour(tiny(tmp_path), tmp_path / "out", attr_cols=["category:cate"], time_col="time",
                               aux_negatives=True, sessions=2, session_len=3, session_gap=15)
    st = Store(res["test"])
    pipe = load_pipeline(st.path / "pipeline")
    cols = {}
    for name in st.columns():
        c = st[name]
        cols[name] = (np.asarray(c[0]), np.diff(c[1])) if isinstance(c, tuple) else np.asarray(c)
    b = pipe.to_batch(cols)
    assert isinstance(b, Batch) and len(b.labels) == st.num_rows == 4
    keys = b.sparse.keys
    for k in ("hist_item", "hist_cate", "neg_hist_item", "neg_hist_cate", "sess_0_item", "sess_1_cate"):
        assert k in keys
    assert b.sparse["hist_item"][1].tolist() == [4, 4, 2, 2]
    # A's gaps are 10 < 15: one session, cut at the test target a5 and keeping its last 3 (a4 is rare)
    assert decode(st, "sess_0_item")[0] == ["a2", "a3", "RARE"] and decode(st, "sess_1_item")[0] == []
    batch = next(iter(BatchLoader(res["train"], 8, shuffle=False, pipeline=pipe)))
    assert "sess_1_item" in batch.sparse.keys and batch.group_ids is not None


def test_scoring_raw_rows_with_empty_history(tmp_path: Path) -> None:
    res = preprocess_behaviour(tiny(tmp_path), tmp_path / "out", attr_cols=["category:cate"], time_col="time")
    pipe = load_pipeline(Path(res["train"]) / "pipeline")
    raw = tmp_path / "score.csv"  # the columns a store holds, histories '|'-delimited (predict's input)
    raw.write_text("user,item,cate,hist_item,hist_cate\nA,a2,x,a1|zz,x|x\nNEW,a1,x,,\n")
    cols = next(iter_transformed(pipe, raw))
    assert cols["hist_item"][1].tolist() == [2, 0] and cols["hist_item"][0][1] == 1  # unseen zz -> rare
    b = pipe.to_batch(cols)
    _, mask = b.sparse.to_padded("hist_item", 50)
    assert mask.sum(1).tolist() == [2, 0] and cols["user"][1] == 1


def test_bad_input_messages(tmp_path: Path) -> None:
    p = tiny(tmp_path, TINY + "D,,x,60\nA,a6,x\n")
    with pytest.raises(DataError, match=r"2 of 11 rows are malformed.*line 11: column 'item' is empty"):
        preprocess_behaviour(p, tmp_path / "o1", time_col="time")
    preprocess_behaviour(p, tmp_path / "o2", time_col="time", max_bad_fraction=0.5)
    rep = json.loads((tmp_path / "o2" / "report.json").read_text())
    assert rep["bad_rows"] == 2 and rep["first_bad_lines"][0]["line"] == 11
    with pytest.raises(DataError, match=r"columns \['when'\] are not in the CSV header"):
        preprocess_behaviour(tiny(tmp_path), tmp_path / "o3", time_col="when")
    with pytest.raises(DataError, match="--type-col"):
        preprocess_behaviour(tiny(tmp_path), tmp_path / "o4", behaviour_types="pv")
    with pytest.raises(DataError, match="behaviour type in"):
        preprocess_behaviour(tiny(tmp_path), tmp_path / "o5", type_col="category", behaviour_types="pv")
    with pytest.raises(DataError, match="fewer than 4 behaviours"):
        preprocess_behaviour(tiny(tmp_path, "user,item\nA,1\nA,2\nA,3\nB,4\n"), tmp_path / "o6")
    with pytest.raises(DataError, match="feature name"):
        preprocess_behaviour(tiny(tmp_path), tmp_path / "o7", attr_cols=["category:hist_x"])


def test_type_filter_and_iso_times(tmp_path: Path) -> None:
    text = ("u,i,kind,ts\n" + "\n".join(f"1,{i},{'buy' if i % 2 else 'pv'},2017-11-25 10:{i:02d}:00"
                                         for i in range(10)) + "\n2,0,buy,2017-11-25 10:00:00\n")
    res = preprocess_behaviour(tiny(tmp_path, text), tmp_path / "out", user_col="u", item_col="i",
                               time_col="ts", type_col="kind", behaviour_types="buy")
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["behaviour_types"] == {"pv": 5, "buy": 6} and rep["rows_filtered_out"] == 5
    assert rep["behaviours"] == 6 and rep["single_behaviour_users"] == 1
    assert rows_of(Store(res["test"]))[0] == (1, 1, "RARE", (1, 3, 5, "RARE"))  # train saw 1, 3, 5 (and 0)
    days = "u,i,d\n" + "".join(f"1,{i},2017-11-{20 + (9 - i) % 10:02d}\n" for i in range(8)) + "2,9,2017-11-01\n"
    preprocess_behaviour(tiny(tmp_path, days, "days.csv"), tmp_path / "o2", user_col="u", item_col="i", time_col="d")
    assert json.loads((tmp_path / "o2" / "report.json").read_text())["out_of_order_rows"] == 7  # dates descend


def test_beauty_slice(tmp_path: Path, shared_data) -> None:
    s3rec = shared_data("amazon_yelp_lastfm_sequences_s3rec")
    with gzip.open(s3rec / "Beauty.txt.gz", "rt") as f:
        lines = f.readlines()[:300]
    src = tmp_path / "beauty.txt"
    src.write_text("".join(lines))
    res = preprocess_behaviour(src, tmp_path / "out", format="s3rec",
                               item_attributes=s3rec / "Beauty_item2attributes.json.gz")
    n_pos = sum(len(x.split()) - 2 for x in lines)
    assert sum(Store(p).num_rows for p in res.values()) == 2 * n_pos
    assert Store(res["valid"]).num_rows == Store(res["test"]).num_rows == 2 * 300


# ---- retrieval samples: positives only, example age -------------------------------------------------------
# A: 6 behaviours; C: 5, out of time order in the file; train targets: a2@25 a3@30 a4@40 (A), c3@35 c1@100 (C)
TIMED = """user,item,category,time
A,a1,x,10
A,a2,x,25
C,c1,z,100
A,a3,y,30
C,c2,z,15
A,a4,x,40
C,c3,x,35
A,a5,y,50
C,c4,x,200
A,a6,y,60
C,c5,x,300
"""


def _random_log(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 30, 600)
    it = rng.integers(0, 40, 600)
    t = rng.random(600)
    order, _ = sort_log(u, t)
    return u[order], it[order], t[order]


def _triples(s: Any, split: int, label_one: bool = True) -> list[tuple[int, int, tuple[int, ...]]]:
    """(user, item, history) of the rows of ``split`` (label-1 rows only with ``label_one``), in row order."""
    off = np.concatenate([[0], np.cumsum(s.hist[1])])
    rows = np.flatnonzero((s.split == split) & ((s.label == 1) | (not label_one)))
    return [(int(s.user[r]), int(s.item[r]), tuple(s.hist[0][off[r]:off[r + 1]].tolist())) for r in rows]


def test_positives_only_are_the_label_one_rows_of_uniform() -> None:
    u, it, t = _random_log()
    uni = build_samples(u, it, t, n_items=40, max_len=5, seed=3)
    pos = build_samples(u, it, t, n_items=40, max_len=5, seed=3, negatives="none")
    assert (pos.label == 1).all() and len(pos) == pos.stats["positives"] == len(uni) // 2
    assert sum(pos.stats["samples"].values()) == len(pos) and pos.neg_hist is None
    for split in (0, 1, 2):
        got, want = _triples(pos, split, False), _triples(uni, split)
        assert sorted(got) == sorted(want)
        if split:  # valid / test: user order, as in uniform
            assert got == want
    assert pos.stats["samples"] == {k: v // 2 for k, v in uni.stats["samples"].items()}
    again = build_samples(u, it, t, n_items=40, max_len=5, seed=3, negatives="none")
    other = build_samples(u, it, t, n_items=40, max_len=5, seed=4, negatives="none")
    assert np.array_equal(pos.item, again.item) and not np.array_equal(pos.item, other.item)  # seeded shuffle
    # no negative is drawn, so a user who saw every item is fine
    full = build_samples(np.zeros(3, np.int64), np.array([0, 1, 0]), None, n_items=2, negatives="none")
    assert full.item.tolist() == [1, 0] and full.stats["samples"] == {"train": 0, "valid": 1, "test": 1}


def test_positives_only_stores_match_uniform(tmp_path: Path) -> None:
    p = tiny(tmp_path, TIMED)
    kw: dict[str, Any] = {"attr_cols": ["category:cate"], "time_col": "time", "seed": 1}
    uni = preprocess_behaviour(p, tmp_path / "uni", **kw)
    pos = preprocess_behaviour(p, tmp_path / "pos", negatives="none", **kw)
    names = ("user", "label", "item", "hist_item", "hist_cate", "cate")
    # vocabularies come from the train rows only; uniform's also hold its sampled negatives, so keys that
    # only a negative brought in are rare in positives-only stores
    pipe = load_pipeline(Path(pos["train"]) / "pipeline")
    known = {t: set(v.keys.tolist()) for t, v in pipe.vocabs_.items()}
    tables = {"user": "user", "item": "item", "hist_item": "item", "hist_cate": "cate", "cate": "cate"}

    def norm(name: str, v: Any) -> Any:
        if isinstance(v, tuple):
            return tuple(norm(name, x) for x in v)
        return v if v in known[tables[name]] or v in (None, "RARE") else "RARE"

    for split in ("train", "valid", "test"):
        got = rows_of(Store(pos[split]), names)
        want = [tuple(c if n == "label" else norm(n, c) for n, c in zip(names, r))
                for r in rows_of(Store(uni[split]), names) if r[1] == 1]
        assert all(r[1] == 1 for r in got) and sorted(got, key=repr) == sorted(want, key=repr)
        if split != "train":
            assert got == want  # user order
    train_keys = {k for r in rows_of(Store(pos["train"])) for k in (r[2], *r[3])}
    assert known["item"] == train_keys == {"a1", "a2", "a3", "a4", "c2", "c3", "c1"}
    rep = json.loads((tmp_path / "pos" / "report.json").read_text())
    assert rep["samples"] == {"train": 5, "valid": 2, "test": 2} and rep["positives"] == 9
    assert rep["cold_positives"] == {"valid": 2, "test": 2}  # a5, c4 / a6, c5: rare (no sampled negatives)
    assert Store(pos["test"]).stats["label_rate"] == 1.0


def test_aux_negatives_need_sampled_negatives(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="--aux-negatives does not go with --negatives none"):
        preprocess_behaviour(tiny(tmp_path), tmp_path / "out", negatives="none", aux_negatives=True)
    assert not (tmp_path / "out").exists()
    u, it, t = _random_log()
    with pytest.raises(DataError, match="ranking"):
        build_samples(u, it, t, n_items=40, negatives="none", aux_negatives=True)


def test_example_age_by_hand(tmp_path: Path) -> None:
    p = tiny(tmp_path, TIMED)
    res = preprocess_behaviour(p, tmp_path / "out", time_col="time", negatives="none", example_age=True)
    time_of = {(r.split(",")[0], r.split(",")[1]): float(r.split(",")[3]) for r in TIMED.splitlines()[1:]}
    tr = Store(res["train"])
    targets = [time_of[(us, i)] for us, i in zip(decode(tr, "user"), decode(tr, "item"))]
    t0, t1 = min(targets), max(targets)
    assert (t0, t1) == (25.0, 100.0)
    want = [(t1 - x) / (t1 - t0) for x in targets]  # a direct per-row computation
    age = tr["example_age"]
    assert age.dtype == np.float32 and np.allclose(age, want, atol=1e-6)
    assert age.min() == 0.0 and age.max() == 1.0
    assert age[np.argmax(targets)] == 0 and age[np.argmin(targets)] == 1  # the latest / earliest train target
    for split in ("valid", "test"):  # scored at the end of training: 0
        assert np.array_equal(Store(res[split])["example_age"], np.zeros(2, np.float32))
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["example_age"] == {"t_start": 25.0, "t_end": 100.0, "unit": "fraction of the training window"}
    # a dense user feature, read as is (not logged or standardised)
    pipe = load_pipeline(tr.path / "pipeline")
    dense = [(e["name"], e["transform"], e["group"]) for e in pipe.spec.dense]
    assert dense == [("example_age", "none", "user")]
    assert [(d.name, d.group) for d in tr.schema.dense] == [("example_age", "user")]
    cols = {n: (np.asarray(c[0]), np.diff(c[1])) if isinstance(c, tuple) else np.asarray(c)
            for n, c in ((n, tr[n]) for n in tr.columns())}
    assert np.allclose(pipe.to_batch(cols).dense[:, 0].numpy(), want, atol=1e-6)
    raw = tmp_path / "score.csv"  # serving: example_age 0, passed through unchanged
    raw.write_text("user,item,hist_item,example_age\nA,a2,a1,0\nA,a3,a1|a2,0.5\n")
    assert next(iter_transformed(pipe, raw))["example_age"].tolist() == [0.0, 0.5]


def test_example_age_with_negatives_and_edge_cases(tmp_path: Path) -> None:
    u, it, t = _random_log(1)
    pos = build_samples(u, it, t, n_items=40, negatives="none", example_age=True)
    uni = build_samples(u, it, t, n_items=40, negatives="uniform", example_age=True)
    tr = pos.split == 0
    assert 0 <= pos.example_age.min() and pos.example_age.max() <= 1 and (pos.example_age[~tr] == 0).all()
    # a label-0 twin carries its positive's age: uniform's train ages are positives-only's, each twice
    assert np.allclose(np.sort(uni.example_age[uni.split == 0]), np.sort(np.repeat(pos.example_age[tr], 2)))
    assert uni.stats["example_age"] == pos.stats["example_age"]
    age, info = example_ages(np.array([5.0, 5.0, 9.0]), np.array([0, 0, 1], np.int8))  # T_end == T_start
    assert age.tolist() == [0.0, 0.0, 0.0] and (info["t_start"], info["t_end"]) == (5.0, 5.0)
    with pytest.raises(DataError, match="timestamps"):
        build_samples(u, it, None, n_items=40, example_age=True)


def test_example_age_needs_times(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="--example-age needs timestamps: give --time-col"):
        preprocess_behaviour(tiny(tmp_path), tmp_path / "o1", example_age=True)
    seq = tmp_path / "seq.txt"
    seq.write_text("1 10 11 12 13\n2 11 14 12\n")
    with pytest.raises(DataError, match="s3rec format has none"):
        preprocess_behaviour(seq, tmp_path / "o2", format="s3rec", example_age=True)
    assert main(["preprocess", "behaviour", str(seq), "--format", "s3rec", "--out", str(tmp_path / "o3"),
                 "--example-age"]) == 2


def test_cli_positives_only_with_example_age(tmp_path: Path) -> None:
    p = tiny(tmp_path, TIMED)
    out = tmp_path / "out"
    assert main(["preprocess", "behaviour", "--input", str(p), "--out", str(out), "--attr-cols",
                 "category:cate", "--time-col", "time", "--negatives", "none", "--example-age", "--seed",
                 "2"]) == 0
    tr, te = Store(out / "train"), Store(out / "test")
    assert tr.num_rows == 5 and te.num_rows == 2 and (tr["label"] == 1).all()
    assert np.allclose(np.sort(tr["example_age"]), [0, 60 / 75, 65 / 75, 70 / 75, 1])  # T_start 25, T_end 100
    opts = tr.preprocessing["options"]
    assert opts["negatives"] == "none" and opts["example_age"] is True
    assert main(["preprocess", "behaviour", str(p), "--out", str(tmp_path / "o2"), "--negatives", "none",
                 "--aux-negatives"]) == 2
    assert main(["preprocess", "behaviour", str(p), "--out", str(tmp_path / "o3"), "--negatives",
                 "none"]) == 0
    assert "example_age" not in Store(tmp_path / "o3" / "train").columns()  # file order without --time-col
