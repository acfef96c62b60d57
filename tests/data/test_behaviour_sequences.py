"""Sequence rows (``preprocess_behaviour(train_rows="sequence")``): the train store round-trips to a naive per-user
window reference, holds exactly the per-prefix store's targets, and leaves valid / test, the item catalogue and
the items each user saw as the per-prefix build has them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from behaviour_rows import decode, rows_of

from ctrkit.data.pipeline.persist import load_pipeline
from ctrkit.data.sources.behaviour import preprocess_behaviour
from ctrkit.data.storage.store import Store
from ctrkit.errors import DataError
from ctrkit.retrieval.catalogue import ItemCatalogue, SeenItems, sequence_rows, sequence_window

MAX_LEN = 4


def random_log(tmp_path: Path, seed: int = 0) -> tuple[Path, dict[str, list[str]]]:
    """A CSV log of 30 users with 1..16 behaviours (items may repeat) and each user's items in time order."""
    rng = np.random.default_rng(seed)
    lines, seqs = ["user,item,category,time"], {}
    for u in range(30):
        items = [f"i{x}" for x in rng.integers(0, 25, rng.integers(1, 17))]
        seqs[f"u{u}"] = items
        lines += [f"u{u},{it},c{int(it[1:]) % 4},{t}" for t, it in enumerate(items)]
    order = rng.permutation(len(lines) - 1) + 1  # file order shuffled: the builder sorts by time
    path = tmp_path / "log.csv"
    path.write_text("\n".join([lines[0], *(lines[i] for i in order)]) + "\n")
    return path, seqs


def naive_windows(seqs: dict[str, list[str]], max_len: int, stride: int) -> list[tuple]:
    """(user, 1, last target, inputs) of every window, by the rule of behaviour_sequences, one loop per user: a
    window every ``stride`` targets back from the last, until a short one (fewer than ``max_len`` inputs) starts at
    the user's first behaviour or no target is left."""
    out = []
    for user, items in seqs.items():
        train = items[:-2]  # the last two: valid, test
        e = len(train) - 1
        while e >= 1:
            s = max(0, e - max_len)
            out.append((user, 1, train[e], tuple(train[s:e])))
            if e < max_len:  # a short window from the first behaviour owns every target it holds
                break
            e -= stride
    return out


def owned_targets(rows: list[tuple], max_len: int, stride: int) -> Counter:
    """(user, target) of the positions each row owns: the last ``stride`` of a full row, all of a shorter one."""
    out = Counter()
    for u, _, item, hist in rows:
        targets = (*hist[1:], item)  # the history shifted by one, then the item
        out.update((u, t) for t in (targets[-stride:] if len(hist) == max_len else targets))
    return out


@pytest.fixture(scope="module", params=[None, 2])
def built(request, tmp_path_factory) -> tuple[dict[str, Path], dict[str, Path], dict[str, list[str]], int]:
    tmp = tmp_path_factory.mktemp("seq")
    log, seqs = random_log(tmp)
    kw = {"attr_cols": ["category:cate"], "time_col": "time", "negatives": "none", "max_len": MAX_LEN, "seed": 3}
    prefix = preprocess_behaviour(log, tmp / "prefix", **kw)
    seq = preprocess_behaviour(log, tmp / "seq", train_rows="sequence", sequence_stride=request.param, **kw)
    return prefix, seq, seqs, request.param or MAX_LEN


def test_train_store_round_trips_to_the_naive_windows(built):
    _, seq, seqs, stride = built
    train = Store(seq["train"])
    assert sequence_rows(train) and not sequence_rows(Store(seq["valid"])) and not sequence_rows(Store(seq["test"]))
    assert sequence_window(train) == (MAX_LEN, stride)
    got = rows_of(train)
    assert sorted(got) == sorted(naive_windows(seqs, MAX_LEN, stride))
    assert max(len(r[3]) for r in got) == MAX_LEN  # some user has several windows
    assert len({r[0] for r in got}) < len(got)
    cates = decode(train, "hist_cate")
    assert all(len(c) == len(r[3]) for c, r in zip(cates, got))  # the attribute history follows the items


def test_same_targets_held_out_rows_catalogue_and_seen_items_as_per_prefix_rows(built):
    prefix, seq, _, stride = built
    per_target = Counter((u, item) for u, _, item, _ in rows_of(Store(prefix["train"])))
    assert owned_targets(rows_of(Store(seq["train"])), MAX_LEN, stride) == per_target
    for split in ("valid", "test"):
        assert rows_of(Store(seq[split])) == rows_of(Store(prefix[split]))

    def catalogue(path: Path) -> dict[str, tuple[int, str]]:
        store = Store(path)
        cat, v = ItemCatalogue.from_store(store), load_pipeline(path / "pipeline").vocabs_
        keys = {"item": dict(zip(v["item"].ids.tolist(), v["item"].keys)),
                "cate": dict(zip(v["cate"].ids.tolist(), v["cate"].keys))}
        return {keys["item"][int(i)]: (int(n), keys["cate"][int(c)])
                for i, c, n in zip(cat.ids, cat.features["cate"], cat.counts)}

    assert catalogue(seq["train"]) == catalogue(prefix["train"])

    def seen(path: Path) -> set[tuple[str, str]]:
        store = Store(path)
        s, v = SeenItems.from_store(store), load_pipeline(path / "pipeline").vocabs_
        users = dict(zip(v["__group__"].ids.tolist(), v["__group__"].keys)) if "__group__" in v else None
        items = dict(zip(v["item"].ids.tolist(), v["item"].keys))
        r, i = s.pairs(s.groups)
        return {(users[int(s.groups[a])] if users else int(s.groups[a]), items[int(b)]) for a, b in zip(r, i)}

    assert seen(seq["train"]) == seen(prefix["train"])


def test_report_and_refused_options(tmp_path: Path, built):
    _, seq, seqs, stride = built
    report = Store(seq["train"]).stats["behaviour"]
    assert report["sequence_rows"]["targets"] == sum(max(len(s) - 3, 0) for s in seqs.values())
    assert report["samples"]["train"] == report["sequence_rows"]["rows"] == len(naive_windows(seqs, MAX_LEN, stride))
    log, _ = random_log(tmp_path, seed=1)
    for bad, match in (({"negatives": "uniform"}, "--negatives uniform"),
                       ({"negatives": "none", "example_age": True}, "--example-age"),
                       ({"negatives": "none", "train_rows": "windows"}, "--train-rows"),
                       ({"negatives": "none", "max_len": 3, "sequence_stride": 4}, "--sequence-stride")):
        with pytest.raises(DataError, match=match):
            preprocess_behaviour(log, tmp_path / "bad", time_col="time", **{"train_rows": "sequence", **bad})
