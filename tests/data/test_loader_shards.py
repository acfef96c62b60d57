"""Data-parallel shares of the BatchLoader (rank / world_size): batch i of an epoch to rank i mod world size."""

import numpy as np
import pytest

from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store, write_store
from ctrkit.schema import DenseFeature, Schema, SparseFeature


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    n = 1003  # not a multiple of any global batch below: every test meets a partial last round
    rows = np.arange(n)
    schema = Schema(dense=[DenseFeature("x")], sparse=[SparseFeature("c", 50, 4)])
    arrays = {"label": (rows % 2).astype("f4"), "x": rows.astype("f4"), "c": (rows % 50).astype("i4")}
    path = tmp_path_factory.mktemp("s") / "st"
    write_store(path, schema, arrays, {"label": "label", "x": "dense", "c": "sparse"})
    return Store(path)


def ids(batch):
    return batch.dense[:, 0].long().numpy()


def loader(store, batch, **kw):
    return BatchLoader(store, batch, seed=5, block_size=64, shuffle_buffer=256, prefetch=0, **kw)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world,per_rank", [(2, 50), (3, 20), (4, 100)])
def test_a_round_is_one_global_batch(store, shuffle, world, per_rank):
    """Round j of the W ranks reads exactly the rows of one process's batch j of W x B rows; every rank steps
    equally often; the rows of the last, partial round are split evenly; nothing is read twice or lost."""
    one = [ids(b) for b in loader(store, world * per_rank, shuffle=shuffle)]
    ranks = [[ids(b) for b in loader(store, per_rank, shuffle=shuffle, rank=r, world_size=world)]
             for r in range(world)]
    assert {len(r) for r in ranks} == {len(one)}
    for j, want in enumerate(one):
        parts = [ranks[r][j] for r in range(world)]
        np.testing.assert_array_equal(np.concatenate(parts), want)
        assert max(map(len, parts)) - min(map(len, parts)) <= (0 if j < len(one) - 1 else 1)


def test_evaluation_shares_are_round_robin(store):
    """Without even_tail, batch i goes to rank i mod W to the end: put back in batch order, the ranks' batches
    are one process's batches, the same size each."""
    one = [ids(b) for b in loader(store, 64, shuffle=False)]
    ranks = [[ids(b) for b in loader(store, 64, shuffle=False, rank=r, world_size=3, even_tail=False)]
             for r in range(3)]
    assert [len(r) for r in ranks] == [6, 5, 5]  # 16 batches
    merged = [ranks[i % 3][i // 3] for i in range(len(one))]
    for got, want in zip(merged, one):
        np.testing.assert_array_equal(got, want)


def test_fewer_rows_than_ranks_in_the_last_round_are_dropped_with_a_warning(store, caplog):
    """1003 = 2 x 500 + 3: the three rows left cannot give four ranks a row each."""
    with caplog.at_level("WARNING"):
        got = [sum(len(b) for b in loader(store, 125, shuffle=False, rank=r, world_size=4)) for r in range(4)]
    assert got == [250, 250, 250, 250]
    assert "3 rows of the last global batch are not read" in caplog.text


def test_drop_last_drops_the_partial_round(store):
    lens = [len(loader(store, 100, shuffle=False, rank=r, world_size=2, drop_last=True)) for r in range(2)]
    assert lens == [5, 5]


@pytest.mark.parametrize("world_from,world_to", [(2, 1), (1, 2), (2, 3)])
def test_resume_at_another_world_size_with_the_same_global_batch(store, world_from, world_to):
    """The position counts rounds: 3 rounds read at one world size, the rest at another, give the rows of an
    uninterrupted epoch, each once."""
    glob = 300
    first = [loader(store, glob // world_from, rank=r, world_size=world_from) for r in range(world_from)]
    seen = []
    for ld in first:
        it = iter(ld)
        seen += [ids(next(it)) for _ in range(3)]
        it.close()
    state = first[0].state_dict()
    rest = []
    for r in range(world_to):
        ld = loader(store, glob // world_to, rank=r, world_size=world_to)
        ld.load_state_dict(state)
        rest += [ids(b) for b in ld]
    got = np.sort(np.concatenate(seen + rest))
    np.testing.assert_array_equal(got, np.arange(1003))


def test_resume_with_another_global_batch_is_refused(store):
    state = loader(store, 100, rank=0, world_size=2).state_dict()
    with pytest.raises(ValueError, match="same global batch"):
        loader(store, 100).load_state_dict(state)


def test_rank_out_of_range(store):
    with pytest.raises(ValueError, match="rank must be in"):
        loader(store, 10, rank=2, world_size=2)
