"""Day-streamed loader: day order, shuffle buffer, content against one concatenated store, exact resume,
data-parallel shares, and the checks of ``data.train`` naming day stores."""

import numpy as np
import pytest
import torch

from ctrkit.data.storage.days import DayStreamLoader, is_day_spec, resolve_day_stores
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.shares import rank_shares
from ctrkit.data.storage.store import Store, write_store
from ctrkit.errors import ConfigError, StoreError
from ctrkit.schema import DenseFeature, Schema, SequenceFeature, SparseFeature

DAY_ROWS = [300, 1, 457, 0, 250]  # an empty day and a one-row day among them

SCHEMA = Schema(
    dense=[DenseFeature("x")],
    sparse=[SparseFeature("c1", 50, 4), SparseFeature("item", 2000, 4), SparseFeature("tags", 7, 4, multi_valued=True)],
    sequence=[SequenceFeature("hist", max_len=3, shares="item")],
    weight="w",
)
KINDS = {"label": "label", "w": "weight", "x": "dense", "c1": "sparse", "item": "sparse", "tags": "jagged",
         "hist": "jagged"}


def _arrays(rows: np.ndarray, rng: np.random.Generator) -> dict:
    """Columns of global rows ``rows``: x = the global row, so a batch names its rows."""
    tag_len, hist_len = rng.integers(0, 4, len(rows)), rng.integers(0, 6, len(rows))
    return {"label": (rows % 2).astype("f4"), "w": (1 + rows % 3).astype("f4"), "x": rows.astype("f4"),
            "c1": (rows % 50).astype("i4"), "item": rows.astype("i8"),
            "tags": (rng.integers(0, 7, tag_len.sum()).astype("i4"), tag_len),
            "hist": (rng.integers(0, 2000, hist_len.sum()).astype("i8"), hist_len)}


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    """Day stores (day_K/train) and one store of all their rows concatenated in day order (the reference)."""
    root = tmp_path_factory.mktemp("days")
    rng = np.random.default_rng(0)
    start, parts = 0, []
    for d, n in enumerate(DAY_ROWS):
        a = _arrays(np.arange(start, start + n), rng)
        write_store(root / f"day_{d}" / "train", SCHEMA, a, KINDS)
        parts.append(a)
        start += n
    cat = {}
    for k, kind in KINDS.items():
        if kind == "jagged":
            cat[k] = (np.concatenate([p[k][0] for p in parts]), np.concatenate([p[k][1] for p in parts]))
        else:
            cat[k] = np.concatenate([p[k] for p in parts])
    write_store(root / "all", SCHEMA, cat, KINDS)
    return [root / f"day_{d}" / "train" for d in range(len(DAY_ROWS))], Store(root / "all")


def _same(a, b) -> None:
    assert torch.equal(a.dense, b.dense) and torch.equal(a.labels, b.labels) and torch.equal(a.weights, b.weights)
    assert a.sparse.keys == b.sparse.keys
    assert torch.equal(a.sparse.values, b.sparse.values) and torch.equal(a.sparse.lengths, b.sparse.lengths)


def test_unshuffled_batches_are_those_of_the_concatenated_store(days):
    paths, whole = days
    loader = DayStreamLoader(paths, 64, shuffle=False, prefetch=0)
    ref = BatchLoader(whole, 64, shuffle=False, prefetch=0)
    assert len(loader) == len(ref) == -(-sum(DAY_ROWS) // 64)
    n = 0
    for got, want in zip(loader, ref):  # batches across day boundaries (with their jagged columns) included
        _same(got, want)
        n += 1
    assert n == len(ref)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_shuffled_order_day_by_day_with_a_bounded_window(days, prefetch):
    paths, whole = days
    loader = DayStreamLoader(paths, 50, shuffle=True, seed=3, block_size=16, shuffle_buffer=64, prefetch=prefetch)
    ref = BatchLoader(whole, 50, shuffle=False, prefetch=0)
    day_start = np.concatenate([[0], np.cumsum(DAY_ROWS)])
    pairs = loader.batch_rows(0)
    glob = day_start[pairs[:, 0]] + pairs[:, 1]
    assert sorted(glob.tolist()) == list(range(sum(DAY_ROWS)))  # every row once
    assert (np.diff(pairs[:, 0]) >= 0).all()  # day order
    assert not (np.diff(glob) == 1).all()  # shuffled
    win_day, _, starts = loader._plan(0)  # the shuffle buffer: <= 64 rows of <= 4 blocks of 16 of one day
    assert (np.diff(starts) <= 64).all() and starts[-1] == sum(DAY_ROWS)
    for g in range(len(win_day)):
        w = pairs[starts[g]: starts[g + 1]]
        assert (w[:, 0] == win_day[g]).all() and len(np.unique(w[:, 1] // 16)) <= 4
    got = list(loader)
    assert len(got) == len(loader)
    seen = np.concatenate([b.dense[:, 0].numpy() for b in got]).astype(np.int64)
    assert np.array_equal(seen, glob)
    for b in got:  # content: the concatenated store's rows of the same global ids
        _same(b, ref.build(b.dense[:, 0].numpy().astype(np.int64)))
    again = DayStreamLoader(paths, 50, shuffle=True, seed=3, block_size=16, shuffle_buffer=64)
    assert np.array_equal(again.batch_rows(0), pairs)  # reproducible from (seed, epoch)
    assert not np.array_equal(again.batch_rows(1), pairs)  # another epoch, another order


def test_stop_mid_epoch_and_resume_gives_the_same_batches(days):
    paths, _ = days
    opts = {"shuffle": True, "seed": 5, "block_size": 16, "shuffle_buffer": 48, "prefetch": 2}
    full = DayStreamLoader(paths, 40, **opts)
    full.set_epoch(1)
    want = list(full)
    first = DayStreamLoader(paths, 40, **opts)
    first.set_epoch(1)
    it = iter(first)
    head = [next(it) for _ in range(7)]
    state = first.state_dict()
    it.close()
    assert state["epoch"] == 1 and state["batches_yielded"] == 7
    resumed = DayStreamLoader(paths, 40, **opts)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(head) + len(rest) == len(want)
    for a, b in zip(head + rest, want):
        _same(a, b)
    assert resumed.epoch == 2 and resumed.batches_yielded == 0  # moved on to the next epoch by itself
    other = DayStreamLoader(paths[:-1], 40, **opts)
    with pytest.raises(ValueError, match="num_rows"):
        other.load_state_dict(state)


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_read_the_single_process_order_in_rounds(days, world):
    paths, _ = days
    opts = {"shuffle": True, "seed": 1, "block_size": 16, "shuffle_buffer": 64, "prefetch": 0}
    one = DayStreamLoader(paths, 20 * world, **opts).batch_rows(0)
    ranks = [DayStreamLoader(paths, 20, rank=r, world_size=world, **opts) for r in range(world)]
    assert len({len(r) for r in ranks}) == 1  # every rank steps as often (even tail)
    shares = [rank_shares(sum(DAY_ROWS), 20, rank=r, world_size=world) for r in range(world)]
    pos = sorted((a, b, r) for r in range(world) for a, b in shares[r])
    assert [a for a, _, _ in pos] == [0, *[b for _, b, _ in pos[:-1]]] and pos[-1][1] == sum(DAY_ROWS)
    rows = {r: ranks[r].batch_rows(0) for r in range(world)}
    taken = {r: 0 for r in range(world)}
    order = []
    for a, b, r in pos:  # the ranks' batches put back in round order are the one process's order
        order.append(rows[r][taken[r]: taken[r] + b - a])
        taken[r] += b - a
    assert np.array_equal(np.concatenate(order), one)
    state = ranks[1].state_dict()
    state["batches_yielded"] = 3
    single = DayStreamLoader(paths, 20 * world, **opts)
    single.load_state_dict(state)  # same global batch at another world size: resumes
    assert single.batches_yielded == 3
    with pytest.raises(ValueError, match="same global batch"):
        DayStreamLoader(paths, 20, **opts).load_state_dict(state)


def test_naming_day_stores(days, tmp_path):
    paths, _ = days
    root = paths[0].parent.parent
    assert resolve_day_stores(str(root / "day_*" / "train")) == paths  # natural order
    for d in (10, 2):  # day_10 after day_2 after day_1
        write_store(tmp_path / f"day_{d}" / "train", SCHEMA, _arrays(np.arange(3), np.random.default_rng(d)), KINDS)
    write_store(tmp_path / "day_1" / "train", SCHEMA, _arrays(np.arange(3), np.random.default_rng(1)), KINDS)
    assert [p.parent.name for p in resolve_day_stores(str(tmp_path / "day_*/train"))] == ["day_1", "day_2", "day_10"]
    assert is_day_spec(["a"]) and is_day_spec("d/day_*/train") and not is_day_spec("d/train") and not is_day_spec(None)
    with pytest.raises(ConfigError, match="matches nothing"):
        resolve_day_stores(str(tmp_path / "nope_*"))
    with pytest.raises(ConfigError, match="not a ctrkit store"):
        resolve_day_stores(str(tmp_path / "day_*"))
    with pytest.raises(ConfigError, match="more than once"):
        resolve_day_stores([str(paths[0]), str(paths[0])])
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_day_stores([str(paths[0]), str(tmp_path / "missing")], "data.train")
    with pytest.raises(ConfigError, match="empty list"):
        resolve_day_stores([])
    other = Schema(dense=[DenseFeature("x")], sparse=[SparseFeature("c1", 51, 4)])
    write_store(tmp_path / "odd", other, {"label": np.zeros(2, "f4"), "x": np.zeros(2, "f4"),
                                          "c1": np.zeros(2, "i4")}, {"label": "label", "x": "dense", "c1": "sparse"})
    with pytest.raises(StoreError, match=r"day store 1 .*another schema"):
        DayStreamLoader([paths[0], tmp_path / "odd"], 8, dense_features=["x"], sparse_keys=["c1"])
