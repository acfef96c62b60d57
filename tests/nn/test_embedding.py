"""EmbeddingBagCollection against one nn.EmbeddingBag per table, and seed 000 §5's dL/dW = P^T dL/dY."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ctrkit.batch import KeyedJagged
from ctrkit.nn.embedding import EmbeddingBagCollection, embedding_parameters
from ctrkit.schema import Schema, SchemaError, SequenceFeature, SparseFeature, TableSpec


def random_kj(keys, sizes, B, max_len=4, gen=None, weights=False, single=False):
    """Random jagged ids with some empty bags (or exactly one id per bag if ``single``);
    sizes[k] = vocab of key k."""
    per_key = {}
    for k in keys:
        if single:
            lengths = torch.ones(B, dtype=torch.int64)
        else:
            lengths = torch.randint(0, max_len + 1, (B,), generator=gen)
            lengths[0] = 0  # always at least one empty bag
        vals = torch.randint(0, sizes[k], (int(lengths.sum()),), generator=gen)
        per_key[k] = (vals, lengths)
    kj = KeyedJagged.from_per_key(per_key)
    if weights:
        kj.weights = torch.rand(kj.values.numel(), generator=gen)
    return kj


def reference(ebc: EmbeddingBagCollection, kj: KeyedJagged, key: str) -> torch.Tensor:
    """Pooled [B, D] of one key with a plain nn.EmbeddingBag holding a copy of its table."""
    t = ebc.tables[ebc.feature_to_table[key]]
    bag = nn.EmbeddingBag(t.num_embeddings, t.embedding_dim, mode=ebc.feature_pooling[key])
    with torch.no_grad():
        bag.weight.copy_(ebc.table_weight(t.name))
    values, _, offsets = kj[key]
    w = None
    if kj.weights is not None:
        i = kj.keys.index(key)
        opk = kj.offset_per_key()
        w = kj.weights[opk[i] : opk[i + 1]]
    return bag(values, offsets[:-1], per_sample_weights=w)


TABLES = [
    TableSpec("ta", 50, 8, ("a", "b")),  # shared by a and b
    TableSpec("tc", 7, 8, ("c",)),
    TableSpec("td", 30, 5, ("d",)),  # another dim
    TableSpec("te", 11, 8, ("e",)),
]
SIZES = {"a": 50, "b": 50, "c": 7, "d": 30, "e": 11}


@pytest.mark.parametrize("single", [False, True], ids=["jagged", "one_id_per_bag"])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_matches_per_table_embedding_bag(pooling, single):
    g = torch.Generator().manual_seed(0)
    pool = {k: pooling for k in SIZES}
    pool["e"] = "mean" if pooling == "sum" else "sum"  # mixed poolings in one dim
    ebc = EmbeddingBagCollection(TABLES, feature_pooling=pool)
    assert ebc.keys == ["a", "b", "c", "d", "e"]
    kj = random_kj(list(SIZES), SIZES, B=9, gen=g, single=single)
    out = ebc(kj)
    d = out.to_dict()
    for k in SIZES:
        ref = reference(ebc, kj, k)
        torch.testing.assert_close(d[k], ref)
        torch.testing.assert_close(out[k], ref)
        if not single:
            assert torch.all(d[k][0] == 0)  # empty bag -> zeros
    cat = out.concat()
    assert cat.shape == (9, 8 * 4 + 5) == (9, ebc.out_features)
    torch.testing.assert_close(cat, torch.cat([d[k] for k in ebc.keys], 1))
    with pytest.raises(ValueError, match="dim 5: \\['d'\\]"):
        out.stacked()


def test_stacked_order_and_subset_and_extra_keys():
    g = torch.Generator().manual_seed(1)
    # output order differs from table order and from the input order; input has an extra key
    f2t = {"e": "te", "a": "ta", "c": "tc", "b": "ta"}
    pool = {"a": "mean"}
    tables = [t for t in TABLES if t.name != "td"]
    ebc = EmbeddingBagCollection(tables, f2t, pool)
    kj = random_kj(["a", "b", "c", "d", "e"], SIZES, B=6, gen=g)
    s = ebc(kj).stacked()
    assert s.shape == (6, 4, 8)
    for i, k in enumerate(["e", "a", "c", "b"]):
        torch.testing.assert_close(s[:, i], reference(ebc, kj, k))


def test_contiguous_slice_of_input():
    g = torch.Generator().manual_seed(2)
    ebc = EmbeddingBagCollection([TABLES[1], TABLES[3]], {"c": "tc", "e": "te"})
    kj = random_kj(["a", "c", "e", "d"], SIZES, B=5, gen=g)
    d = ebc(kj).to_dict()
    for k in ("c", "e"):
        torch.testing.assert_close(d[k], reference(ebc, kj, k))


@pytest.mark.parametrize("single", [False, True], ids=["jagged", "one_id_per_bag"])
def test_per_sample_weights(single):
    g = torch.Generator().manual_seed(3)
    ebc = EmbeddingBagCollection(TABLES)
    kj = random_kj(list(SIZES), SIZES, B=7, gen=g, weights=True, single=single)
    d = ebc(kj).to_dict()
    for k in SIZES:
        torch.testing.assert_close(d[k], reference(ebc, kj, k))
    ebc_mean = EmbeddingBagCollection(TABLES, feature_pooling={"a": "mean"})
    with pytest.raises(ValueError, match="per-sample weights need pooling 'sum'"):
        ebc_mean(kj)


@pytest.mark.parametrize("single", [False, True], ids=["jagged", "one_id_per_bag"])
def test_backward_equals_seed_p_transpose_dy(single):
    """Seed 000 §5: dL/dW = P^T dL/dY, P[n, m] = number of times id m occurs in bag n."""
    g = torch.Generator().manual_seed(4)
    ebc = EmbeddingBagCollection(TABLES)
    kj = random_kj(list(SIZES), SIZES, B=6, gen=g, single=single)
    out = ebc(kj)
    dY = {k: torch.randn(6, ebc.tables[ebc.feature_to_table[k]].embedding_dim, generator=g) for k in ebc.keys}
    loss = sum((out[k] * dY[k]).sum() for k in ebc.keys)
    loss.backward()
    for name, t in ebc.tables.items():
        expected = torch.zeros(t.num_embeddings, t.embedding_dim)
        for k in t.features:  # a shared table sums the P^T dY of its features
            values, _, offsets = kj[k]
            P = torch.zeros(6, t.num_embeddings)
            for n in range(6):
                for x in values[int(offsets[n]) : int(offsets[n + 1])].tolist():
                    P[n, x] += 1
            expected += P.t() @ dY[k]
        w = ebc.weights[f"dim{t.embedding_dim}"]
        assert w.grad.is_sparse
        o = ebc.row_offset[name]
        got = w.grad.to_dense()[o : o + t.num_embeddings]
        torch.testing.assert_close(got, expected)


def test_sparse_grad_touches_only_used_rows():
    ebc = EmbeddingBagCollection([TableSpec("t", 100, 4, ("x",))])
    kj = KeyedJagged.from_dense(["x"], torch.tensor([[3], [7], [3]]))
    ebc(kj).stacked().sum().backward()
    grad = ebc.weights["dim4"].grad.coalesce()
    assert sorted(grad.indices()[0].tolist()) == [3, 7]
    ebc_dense = EmbeddingBagCollection([TableSpec("t", 100, 4, ("x",))], sparse_grad=False)
    ebc_dense(kj).stacked().sum().backward()
    assert not ebc_dense.weights["dim4"].grad.is_sparse


def test_out_of_range_id_names_feature_id_and_table():
    ebc = EmbeddingBagCollection(TABLES)
    kj = random_kj(list(SIZES), SIZES, B=4, gen=torch.Generator().manual_seed(5), max_len=2)
    vals, lens, _ = kj["c"]
    per_key = {k: (kj[k][0].clone(), kj[k][1]) for k in kj.keys}
    per_key["c"] = (torch.cat([vals, torch.tensor([7])]), lens + torch.tensor([0, 0, 0, 1]))
    bad = KeyedJagged.from_per_key(per_key)
    with pytest.raises(IndexError, match="feature 'c': id 7 is outside table 'tc' of size 7"):
        ebc(bad)
    per_key["c"] = (torch.cat([vals, torch.tensor([-1])]), lens + torch.tensor([0, 0, 0, 1]))
    with pytest.raises(IndexError, match="feature 'c': id -1"):
        ebc(KeyedJagged.from_per_key(per_key))
    with pytest.raises(IndexError, match="feature 'a': id 50 is outside table 'ta' of size 50"):
        ebc.lookup("a", torch.tensor([[1, 50]]))
    # one id per bag takes the gather path; same message
    ids = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 30, 5]])
    with pytest.raises(IndexError, match="feature 'd': id 30 is outside table 'td' of size 30"):
        ebc(KeyedJagged.from_dense(list(SIZES), ids))
    ids[1, 3] = 29
    ebc(KeyedJagged.from_dense(list(SIZES), ids))  # largest valid id is fine


def test_lookup_matches_table_rows():
    ebc = EmbeddingBagCollection(TABLES)
    ids = torch.tensor([[1, 2, 0], [6, 6, 3]])
    e = ebc.lookup("c", ids)
    assert e.shape == (2, 3, 8)
    torch.testing.assert_close(e, ebc.table_weight("tc")[ids])


def test_init_bounds_and_embedding_marker():
    ebc = EmbeddingBagCollection(TABLES)
    for t in ebc.tables.values():
        w = ebc.table_weight(t.name)
        assert w.abs().max() <= (1.0 / t.num_embeddings) ** 0.5
    params = list(embedding_parameters(ebc))
    assert len(params) == 2 and all(p.is_embedding for p in params)
    assert len(list(embedding_parameters(copy.deepcopy(ebc)))) == 2


def test_from_schema_shared_tables_and_sequences():
    schema = Schema(
        sparse=[
            SparseFeature("item", 20, 4),
            SparseFeature("cat", 5, 4),
            SparseFeature("tag", 9, 3, multi_valued=True, pooling="mean"),
            SparseFeature("item2", 20, 4, table="item"),
        ],
        sequence=[SequenceFeature("hist", 6, "item", pooling="none"),
                  SequenceFeature("hist_cat", 6, "cat", pooling="sum")],
    )
    ebc = EmbeddingBagCollection.from_schema(schema)
    assert ebc.keys == ["item", "cat", "tag", "item2", "hist_cat"]
    assert ebc.feature_to_table["item2"] == "item" and ebc.feature_to_table["hist_cat"] == "cat"
    assert ebc.feature_pooling["tag"] == "mean"
    assert ebc.lookup("hist", torch.tensor([[1, 2]])).shape == (1, 2, 4)
    with pytest.raises(SchemaError, match="pooling 'none'"):
        EmbeddingBagCollection.from_schema(schema, ["item", "hist"])
    sub = EmbeddingBagCollection.from_schema(schema, ["cat"])
    assert list(sub.tables) == ["cat"]
    g = torch.Generator().manual_seed(6)
    sizes = {"item": 20, "cat": 5, "tag": 9, "item2": 20, "hist": 20, "hist_cat": 5}
    kj = random_kj(schema.sparse_keys, sizes, B=5, gen=g)
    d = ebc(kj).to_dict()
    for k in ebc.keys:
        torch.testing.assert_close(d[k], reference(ebc, kj, k))
