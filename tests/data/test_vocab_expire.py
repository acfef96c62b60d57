"""Expiry (``preprocess ... --vocab-from PARENT --grow --expire-after N``) against a naive reference: values not
seen in the last N versions are evicted and map to id 1, their ids are reused by new values (so the tables stop
growing), the ids whose value changed are recorded as reset; 30 synthetic days keep the table sizes, the held keys
and the pending counts flat at a cap; Criteo (one process and --workers 2 give the same stores), hashed tables,
behaviour stores, and the bad inputs."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from ctrkit.cli import main
from ctrkit.data.pipeline.persist import load_pending, load_pending_seen
from ctrkit.data.pipeline.vocab import VocabBuilder
from ctrkit.data.pipeline.vocab_grow import grow_vocabulary, pending_of
from ctrkit.data.sources.behaviour import preprocess_behaviour
from ctrkit.data.sources.criteo import SPARSE_NAMES, preprocess_criteo
from ctrkit.data.sources.table import preprocess_table
from ctrkit.data.storage.fitted import fitted_at
from ctrkit.data.storage.store import Store
from ctrkit.errors import DataError
from tests.conftest import two_behaviour_days

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "data" / "criteo_sample.tsv.gz"
SPEC = {"label": "label", "dense": [{"name": "price", "transform": "standardize"}],
        "sparse": [{"name": "user"}, {"name": "item"}]}


class Reference:
    """One column's vocabulary over versions, by dictionaries: a value is admitted when its count (kept since it
    was last evicted) reaches ``min_freq``, in first-appearance order of its version, at the smallest free id, else
    at the next new id; a value (kept or pending) not seen in the last ``expire_after`` versions is forgotten."""

    def __init__(self, min_freq: int, expire_after: int | None) -> None:
        self.min_freq, self.expire_after = min_freq, expire_after
        self.ids: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.last: dict[str, int] = {}
        self.size, self.version = 2, 0

    def add(self, values: list[str]) -> list[int]:
        """The next version's values ('' = missing) -> the ids reset in it, sorted."""
        self.version += 1
        v, present = self.version, [x for x in values if x]
        for x in present:
            self.counts[x] = self.counts.get(x, 0) + 1
            self.last[x] = v
        freed = []
        if self.expire_after:
            for x in [x for x, s in self.last.items() if s <= v - self.expire_after]:
                if x in self.ids:
                    freed.append(self.ids.pop(x))
                del self.counts[x], self.last[x]
        held = set(self.ids.values())
        free = [i for i in range(2, self.size) if i not in held]
        reused = []
        for x in dict.fromkeys(present):
            if x not in self.ids and self.counts[x] >= self.min_freq:
                if free:
                    self.ids[x] = free.pop(0)
                    reused.append(self.ids[x])
                else:
                    self.ids[x], self.size = self.size, self.size + 1
        return sorted(set(freed) | set(reused)) if v > 1 else []

    def pending(self) -> dict[str, int]:
        return {x: n for x, n in self.counts.items() if x not in self.ids}

    def encode(self, values: list[str]) -> list[int]:
        return [0 if not x else self.ids.get(x, 1) for x in values]


# ---- the growth of one vocabulary, against the reference ----------------------------------------------------
@pytest.mark.parametrize("min_freq, expire_after", [(1, 1), (2, 2), (2, 4), (1, None)])
def test_grow_with_expiry_matches_the_reference(min_freq: int, expire_after: int | None) -> None:
    rng = np.random.default_rng(5)
    ref = Reference(min_freq, expire_after)
    vocab = pending = seen = None
    for day in range(12):
        values = [f"v{k}" for k in rng.integers(3 * day, 3 * day + 14, 25)] + [""] * 2  # drifting values
        reset = ref.add(values)
        b = VocabBuilder("t", "str")
        provisional = b.add(np.array(values))
        if vocab is None:
            vocab, lut = b.finish(min_freq=min_freq)
            pending = pending_of(b, vocab)
        else:
            vocab, lut, pending, seen = grow_vocabulary(vocab, pending, b, min_freq=min_freq, version=day + 1,
                                                        expire_after=expire_after, pending_seen=seen)
            assert (vocab.reset if vocab.reset is not None else []).tolist() == reset, day
        assert dict(zip(vocab.keys.tolist(), vocab.ids.tolist())) == ref.ids, day
        assert vocab.size == ref.size
        assert dict(zip(pending[0].tolist(), pending[1].tolist())) == ref.pending(), day
        assert vocab.lookup(np.array(values)).tolist() == ref.encode(values)  # what the store holds
        assert (lut[provisional] if lut is not None else provisional).tolist() == ref.encode(values)
        assert dict(zip(vocab.keys.tolist(), vocab.last_seen.tolist())) == {x: ref.last[x] for x in ref.ids} \
            if day else vocab.last_seen is None
        if seen is not None:
            assert dict(zip(pending[0].tolist(), seen.tolist())) == {x: ref.last[x] for x in ref.pending()}
    if expire_after:
        assert ref.size < 3 * 12  # the reference too reused ids: the test compares reuse, not plain growth


# ---- 30 days of table stores: memory flat at the cap --------------------------------------------------------
def _day(d: int, rng: np.random.Generator) -> list[tuple[int, str, str, float]]:
    """Day ``d``: items i{5d}..i{5d+29} and users u{3d}..u{3d+19} twice each (drifting ids), plus 6 items seen once
    (left below --min-freq 2: pending counts), shuffled."""
    items = [f"i{5 * d + k}" for k in range(30)] * 2 + [f"once{d}_{k}" for k in range(6)]
    users = [f"u{3 * d + k % 20}" for k in range(len(items))]
    order = rng.permutation(len(items))
    return [(int(rng.integers(2)), users[j], items[j], float(rng.normal())) for j in order]


def _csv(path: Path, rows: list[tuple[int, str, str, float]]) -> Path:
    path.write_text("label,user,item,price\n" + "".join(f"{a},{b},{c},{d}\n" for a, b, c, d in rows))
    return path


def _pairs(store: Path) -> list[tuple[int, int]]:
    s = Store(store)
    return sorted(zip(np.asarray(s["user"]).tolist(), np.asarray(s["item"]).tolist()))


def test_thirty_days_keep_tables_vocabularies_and_pending_counts_flat_at_the_cap(tmp_path: Path) -> None:
    n_days, after = 30, 3
    # steady state: the values of the last 3 days (items 5 * 2 + 30 = 40, users 3 * 2 + 20 = 26) + ids 0 and 1
    cap = 42
    rng = np.random.default_rng(0)
    refs = {c: Reference(2, after) for c in ("user", "item")}
    parent, sizes, held, pending = None, [], [], []
    for d in range(n_days):
        rows = _day(d, rng)
        grow = {} if parent is None else {"vocab_from": parent, "grow": True, "expire_after": after}
        store = preprocess_table(_csv(tmp_path / f"day_{d}.csv", rows), SPEC, tmp_path / f"s{d}", split="1",
                                 min_freq=2, max_vocab=cap, max_vocab_mode="cap", **grow)["train"]
        p = fitted_at(store)
        resets = {c: refs[c].add([r[1 + j] for r in rows]) for j, c in enumerate(("user", "item"))}
        want = sorted(zip(refs["user"].encode([r[1] for r in rows]), refs["item"].encode([r[2] for r in rows])))
        assert _pairs(store) == want, d  # every row's ids, as the reference gives them
        for c in ("user", "item"):
            v = p.vocabs_[c]
            assert dict(zip(v.keys.tolist(), v.ids.tolist())) == refs[c].ids, (d, c)
            assert (v.reset.tolist() if v.reset is not None else []) == resets[c], (d, c)
            if parent is not None:  # the values kept from yesterday keep their ids
                old = fitted_at(parent).vocabs_[c]
                kept = np.isin(old.keys, v.keys)
                np.testing.assert_array_equal(v.lookup(old.keys[kept]), old.ids[kept])
                assert (v.lookup(old.keys[~kept]) == 1).all()  # evicted: rare
        assert Store(store).schema.tables()["item"].num_embeddings == p.vocabs_["item"].size
        sizes.append(p.vocabs_["item"].size)
        held.append(len(p.vocabs_["item"].keys))
        pending.append(len(load_pending(store)["item"][0]))
        if d:
            assert len(load_pending_seen(store)["item"]) == pending[-1]
        parent = store
    print(f"item table rows per day {sizes}; values held {held}; pending counts {pending}")
    assert max(sizes) <= cap and sizes[after - 1:] == [cap] * (n_days - after + 1)  # flat from day 3 on
    assert held[after - 1:] == [40] * (n_days - after + 1) and max(pending[after:]) == min(pending[after:]) == 18
    lineage = fitted_at(parent).lineage_
    assert lineage["version"] == n_days and lineage["expire_after"] == after
    assert lineage["tables"]["item"] == {"parent_size": cap, "size": cap, "keys": 40, "reset": 5}
    # a day bringing more new values than the ids freed is an error naming the table and the cap, not an overflow
    burst = _day(n_days, rng) + [(1, "u0", f"new{k}", 0.0) for k in range(2) for _ in range(2)]
    with pytest.raises(DataError, match=r"'item'.*over max_vocab=42.*--expire-after"):
        preprocess_table(_csv(tmp_path / "burst.csv", burst), SPEC, tmp_path / "burst", split="1", min_freq=2,
                         vocab_from=parent, grow=True, expire_after=after)


# ---- Criteo: one process and --workers 2 -------------------------------------------------------------------
def _sample(n: int) -> list[str]:
    with gzip.open(SAMPLE, "rt") as f:
        return f.read().splitlines()[:n]


def test_criteo_days_with_expiry_one_process_and_two_workers_agree(tmp_path: Path) -> None:
    lines = _sample(1500)
    days = [lines[:500], lines[500:1000], lines[1000:]]
    files = []
    for i, d in enumerate(days):
        files.append(tmp_path / f"day_{i}.tsv")
        files[-1].write_text("\n".join(d) + "\n")
    refs = {c: Reference(2, 1) for c in SPARSE_NAMES}
    one = preprocess_criteo(files[0], tmp_path / "d0", split="1,0,0", min_freq=2, progress=False)["train"]
    for i in (0, 1, 2):
        resets = {c: refs[c].add([ln.split("\t")[14 + j] for ln in days[i]]) for j, c in enumerate(SPARSE_NAMES)}
        if i == 0:
            continue
        opts = {"split": "1,0,0", "min_freq": 2, "grow": True, "expire_after": 1, "progress": False}
        parent, one = one, preprocess_criteo(files[i], tmp_path / f"d{i}", vocab_from=one, **opts)["train"]
        if i == 2:  # the last day (ids freed twice over) as count / encode tasks too
            two = preprocess_criteo(files[i], tmp_path / "w", vocab_from=parent, workers=2, task_bytes=40_000,
                                    **opts)["train"]
            for f in sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file() and p.suffix != ".json"):
                assert (one / f).read_bytes() == (two / f).read_bytes(), f  # --workers 2 == one process
        v = fitted_at(one).vocabs_
        for c in SPARSE_NAMES:
            assert dict(zip(v[c].keys.tolist(), v[c].ids.tolist())) == {int(k, 16): i for k, i in refs[c].ids.items()}
            assert (v[c].reset.tolist() if v[c].reset is not None else []) == resets[c], (i, c)
    assert sum(len(v[c].reset) for c in SPARSE_NAMES if v[c].reset is not None) > 100  # ids really reused
    assert json.loads((one / "manifest.json").read_text())["preprocessing"]["vocab_lineage"]["expire_after"] == 1


def test_criteo_hashed_vocabulary_drops_expired_keys_and_resets_no_row(tmp_path: Path) -> None:
    lines = _sample(600)
    (tmp_path / "a.tsv").write_text("\n".join(lines[:300]) + "\n")
    (tmp_path / "b.tsv").write_text("\n".join(lines[300:]) + "\n")
    parent = preprocess_criteo(tmp_path / "a.tsv", tmp_path / "a", split="1,0,0", min_freq=2, max_vocab=64,
                               progress=False)["train"]
    grown = preprocess_criteo(tmp_path / "b.tsv", tmp_path / "b", split="1,0,0", min_freq=2, vocab_from=parent,
                              grow=True, expire_after=1, progress=False)["train"]
    pv, gv = fitted_at(parent).vocabs_["C3"], fitted_at(grown).vocabs_["C3"]
    gone = ~np.isin(pv.keys, gv.keys)
    assert gv.size == 64 and gone.any() and gv.reset is None  # a bucket is shared: no row of it is reset
    np.testing.assert_array_equal(gv.ids, gv.keys % 64)
    assert (gv.lookup(pv.keys[gone]) == 1).all()  # an expired key is rare, as in a first fit with min_freq


# ---- behaviour stores ---------------------------------------------------------------------------------------
def test_behaviour_store_evicts_items_and_reuses_their_ids_in_histories(tmp_path: Path) -> None:
    first, second = two_behaviour_days(tmp_path)
    s1 = preprocess_behaviour(first, tmp_path / "s1", negatives="none", max_len=4)["train"]
    s2 = preprocess_behaviour(second, tmp_path / "s2", negatives="none", max_len=4, vocab_from=s1, grow=True,
                              expire_after=1)["train"]
    v1, v2 = fitted_at(s1).vocabs_["item"], fitted_at(s2).vocabs_["item"]
    gone = [k for k in v1.keys.tolist() if k not in v2.keys.tolist()]
    assert gone and (v2.lookup(np.array(gone)) == 1).all()
    new = [k for k in v2.keys.tolist() if k not in v1.keys.tolist()]
    assert new and set(v2.lookup(np.array(new)).tolist()) <= set(v2.reset.tolist())  # ids freed by the gone
    assert v2.size == v1.size  # fewer new items than freed ids: the table did not grow
    hist = np.asarray(Store(s2)["hist_item"]).ravel()
    assert set(hist.tolist()) <= {0, 1, *v2.ids.tolist()}


# ---- bad input ------------------------------------------------------------------------------------------------
def test_expire_after_needs_grow_and_a_positive_count(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = _csv(tmp_path / "d.csv", [(1, "u1", "a", 1.0), (0, "u2", "b", 2.0)])
    parent = preprocess_table(data, SPEC, tmp_path / "p", split="1")["train"]
    with pytest.raises(DataError, match="--expire-after 2 .*add --grow"):
        preprocess_table(data, SPEC, tmp_path / "n", split="1", vocab_from=parent, expire_after=2)
    with pytest.raises(DataError, match="--expire-after must be an integer >= 1"):
        preprocess_table(data, SPEC, tmp_path / "n", split="1", vocab_from=parent, grow=True, expire_after=0)
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    base = ["preprocess", "table", str(data), "--schema", str(tmp_path / "spec.json"), "--split", "1"]
    with caplog.at_level(logging.ERROR, logger="ctrkit"):
        assert main([*base, "--out", str(tmp_path / "x"), "--vocab-from", str(parent), "--expire-after", "1"]) == 2
        assert "add --grow" in caplog.text and not (tmp_path / "x").exists()
        assert main(["preprocess", "criteo", str(data), "--out", str(tmp_path / "y"), "--expire-after", "1"]) == 2
    with pytest.raises(SystemExit):
        main([*base, "--out", str(tmp_path / "z"), "--grow", "--vocab-from", str(parent), "--expire-after", "0"])
