import threading

import numpy as np
import pytest
import torch

from ctrkit.batch import KeyedJagged
from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.pipeline.multihot import MultiHot
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store, write_store
from ctrkit.schema import DenseFeature, Schema, SequenceFeature, SparseFeature

N = 1000


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Rows carry their own index: label = row % 2, x = row, c1 = row % 50, tags/hist jagged."""
    rng = np.random.default_rng(0)
    rows = np.arange(N)
    tag_len = rng.integers(0, 4, N)
    hist_len = rng.integers(0, 9, N)
    schema = Schema(
        dense=[DenseFeature("x"), DenseFeature("y")],
        sparse=[SparseFeature("c1", 50, 4), SparseFeature("item", 1000, 4),
                SparseFeature("tags", 7, 4, multi_valued=True)],
        sequence=[SequenceFeature("hist", max_len=5, shares="item")],
        weight="w", group_id="uid",
    )
    arrays = {
        "label": (rows % 2).astype("f4"), "w": (1 + rows % 3).astype("f4"), "uid": (rows // 10).astype("i8"),
        "x": rows.astype("f4"), "y": (-rows).astype("f4"),
        "c1": (rows % 50).astype("i4"), "item": rows.astype("i8"),
        "tags": (rng.integers(0, 7, tag_len.sum()).astype("i4"), tag_len),
        "hist": (rng.integers(0, 1000, hist_len.sum()).astype("i8"), hist_len),
    }
    kinds = {"label": "label", "w": "weight", "uid": "group", "x": "dense", "y": "dense", "c1": "sparse",
             "item": "sparse", "tags": "jagged", "hist": "jagged"}
    path = tmp_path_factory.mktemp("s") / "st"
    write_store(path, schema, arrays, kinds)
    return Store(path)


def row_ids(batch):
    return batch.dense[:, 0].long()


def naive_sparse(store, rows):
    """Per-row loop reference of the KeyedJagged for ``rows``."""
    vals, lens = [], []
    for key in store.schema.sparse_keys:
        col = store[key]
        for r in rows:
            if isinstance(col, tuple):
                v, o = col
                ids = list(v[o[r]:o[r + 1]])
                if key == "hist":
                    ids = ids[-5:]
            else:
                ids = [col[r]]
            vals += [int(i) for i in ids]
            lens.append(len(ids))
    return vals, lens


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_every_row_once_and_content(store, shuffle, prefetch):
    loader = BatchLoader(store, 64, shuffle=shuffle, block_size=32, shuffle_buffer=128, prefetch=prefetch)
    assert len(loader) == 16
    seen = []
    for batch in loader:
        r = row_ids(batch).numpy()
        seen.append(r)
        assert batch.dense.dtype == torch.float32 and batch.dense.shape == (len(r), 2)
        assert torch.equal(batch.dense[:, 1], -batch.dense[:, 0])
        assert torch.equal(batch.labels, torch.from_numpy((r % 2).astype("f4")))
        assert torch.equal(batch.weights, torch.from_numpy((1 + r % 3).astype("f4")))
        assert torch.equal(batch.group_ids, torch.from_numpy(r // 10))
        kj = batch.sparse
        assert kj.keys == ["c1", "item", "tags", "hist"] and kj.stride == len(r)
        vals, lens = naive_sparse(store, r)
        assert kj.values.tolist() == vals and kj.lengths.tolist() == lens
        assert kj.offsets.tolist() == np.concatenate([[0], np.cumsum(lens)]).tolist()
    seen = np.concatenate(seen)
    assert np.array_equal(np.sort(seen), np.arange(N))
    assert np.array_equal(seen, np.arange(N)) != shuffle
    assert loader.epoch == 1  # auto-advanced after a full epoch


def test_single_valued_layout_equals_from_dense(store):
    loader = BatchLoader(store, 100, sparse_keys=["c1", "item"], seed=3, prefetch=0)
    batch = next(iter(loader))
    r = row_ids(batch)
    ref = KeyedJagged.from_dense(["c1", "item"], torch.stack([r % 50, r], 1))
    assert torch.equal(batch.sparse.values, ref.values)
    assert torch.equal(batch.sparse.lengths, ref.lengths)
    assert torch.equal(batch.sparse.offsets, ref.offsets)


def test_drop_last_rows_and_dense_selection(store):
    loader = BatchLoader(store, 300, drop_last=True, shuffle=True, block_size=64, dense_features=["y"],
                         rows=slice(100, 1000))
    assert len(loader) == 3
    batches = list(loader)
    assert [len(b) for b in batches] == [300, 300, 300]
    seen = np.concatenate([-b.dense[:, 0].numpy() for b in batches]).astype(int)
    assert np.array_equal(np.sort(seen), np.arange(100, 1000))
    loader = BatchLoader(store, 300, drop_last=False, shuffle=False)
    assert [len(b) for b in loader] == [300, 300, 300, 100]


def test_seed_determinism_and_epochs_differ(store):
    def order(seed, epoch):
        loader = BatchLoader(store, 128, seed=seed, block_size=16, shuffle_buffer=64)
        loader.set_epoch(epoch)
        return np.concatenate([row_ids(b).numpy() for b in loader])

    assert np.array_equal(order(1, 0), order(1, 0))
    assert not np.array_equal(order(1, 0), order(1, 1))
    assert not np.array_equal(order(1, 0), order(2, 0))
    # rows move beyond their block: the shuffle buffer mixes rows of different blocks in one batch
    first = order(1, 0)[:64]
    assert len(np.unique(first // 16)) > 2


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_mid_epoch(store, shuffle):
    kw = {"shuffle": shuffle, "seed": 7, "block_size": 32, "shuffle_buffer": 96, "prefetch": 2}
    ref = BatchLoader(store, 96, **kw)
    ref.set_epoch(2)
    full = list(ref)
    a = BatchLoader(store, 96, **kw)
    a.set_epoch(2)
    it = iter(a)
    for _ in range(4):
        next(it)
    state = a.state_dict()
    it.close()
    assert state["epoch"] == 2 and state["batches_yielded"] == 4
    b = BatchLoader(store, 96, **kw)
    b.load_state_dict(state)
    rest = list(b)
    assert len(rest) == len(full) - 4
    for x, y in zip(rest, full[4:]):
        assert torch.equal(x.dense, y.dense) and torch.equal(x.labels, y.labels)
        assert torch.equal(x.sparse.values, y.sparse.values) and torch.equal(x.sparse.offsets, y.sparse.offsets)
    assert b.state_dict()["epoch"] == 3 and b.state_dict()["batches_yielded"] == 0
    with pytest.raises(ValueError, match="batch_size"):
        BatchLoader(store, 50, **kw).load_state_dict(state)


def test_prefetch_error_propagates_and_thread_stops(store):
    class Exploding:
        def __getitem__(self, idx):
            raise OSError("disk gone")

    loader = BatchLoader(store, 100, shuffle=False, prefetch=2)
    loader._store_view.labels = Exploding()
    with pytest.raises(OSError, match="disk gone"):
        list(loader)
    # abandoning an iterator mid-epoch stops the worker thread
    loader = BatchLoader(store, 10, shuffle=True, prefetch=2)
    it = iter(loader)
    next(it)
    it.close()
    assert not any(t.name == "ctrkit-batch-prefetch" and t.is_alive() for t in threading.enumerate())


def test_multi_hot_applied_from_the_pipeline(store):
    mh = MultiHot([50, 1000], 3, 100)  # reference: built by hand from the schema's table sizes
    pipe = FeaturePipeline.from_schema(store.schema).with_multi_hot(3, 100)
    batch = next(iter(BatchLoader(store, 20, shuffle=False, pipeline=pipe, prefetch=0)))
    r = row_ids(batch)
    item = batch.sparse["item"][0].view(20, 3)
    assert torch.equal(item[:, 0], r) and torch.equal(item[:, 1:], mh.weight[1][r][:, 1:].long())
    assert torch.equal(batch.sparse["c1"][0], r % 50)


def test_bad_options(store):
    with pytest.raises(KeyError, match="no column 'nope'"):
        BatchLoader(store, 10, dense_features=["nope"])
    with pytest.raises(ValueError, match="batch_size"):
        BatchLoader(store, 0)
    with pytest.raises(ValueError, match="contiguous"):
        BatchLoader(store, 10, rows=slice(0, 100, 2))
