"""The embedding seam: the fused EmbeddingBagCollection against one nn.EmbeddingBag per table, seed 000
§5's dL/dW = P^T dL/dY, ``sequence()`` against a padding loop, ``lookup`` by table, per-table state-dict
keys, and ``make_embeddings``' options."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from ctrkit.batch import KeyedJagged
from ctrkit.models.registry import create_model
from ctrkit.nn.embedding import EmbeddingBagCollection, EmbeddingCollection
from ctrkit.nn.embedding_factory import make_embeddings
from ctrkit.schema import DenseFeature, Schema, SchemaError, SequenceFeature, SparseFeature, TableSpec


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


def fused_grad(ebc: EmbeddingBagCollection, table: str) -> torch.Tensor:
    """The gradient rows of ``table``, cut out of its fused weight's gradient."""
    t = ebc.tables[table]
    (w,) = [p for p in ebc.embedding_parameters() if p.shape[1] == t.embedding_dim]
    o = ebc.row_offset[table]
    return w.grad.to_dense()[o : o + t.num_embeddings]


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
    with pytest.raises(ValueError, match="dim 5: \\['d'\\]"):
        out.fields()


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
    assert torch.equal(ebc(kj).fields(), s.transpose(0, 1))  # field-major, the same values


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


@pytest.mark.parametrize("layout", ["sparse", "dense"])
@pytest.mark.parametrize(("single", "weights"), [(False, False), (True, False), (False, True)],
                         ids=["jagged", "one_id_per_bag", "weighted"])
def test_backward_equals_seed_p_transpose_dy(single, weights, layout):
    """Seed 000 §5: dL/dW = P^T dL/dY, P[n, m] = the weight of id m in bag n (1 per occurrence, its per-sample
    weight, or 1/|bag| under mean pooling), whether the fused weights get sparse gradients (dense_grad_max_rows
    0) or dense ones built by index_add_ (tables this small, by default)."""
    g = torch.Generator().manual_seed(4)
    pool = {} if weights else {"b": "mean", "d": "mean"}  # mean next to sum in one fused weight and alone
    ebc = EmbeddingBagCollection(TABLES, feature_pooling=pool, **({"dense_grad_max_rows": 0} if layout == "sparse" else {}))
    kj = random_kj(list(SIZES), SIZES, B=6, gen=g, single=single, weights=weights)
    out = ebc(kj)
    dY = {k: torch.randn(6, ebc.tables[ebc.feature_to_table[k]].embedding_dim, generator=g) for k in ebc.keys}
    loss = sum((out[k] * dY[k]).sum() for k in ebc.keys)
    loss.backward()
    assert all(p.grad.is_sparse == (layout == "sparse") for p in ebc.embedding_parameters())
    for name, t in ebc.tables.items():
        expected = torch.zeros(t.num_embeddings, t.embedding_dim)
        for k in t.features:  # a shared table sums the P^T dY of its features
            values, _, offsets = kj[k]
            w = kj.weights[kj.offset_per_key()[kj.keys.index(k)]:] if weights else None
            P = torch.zeros(6, t.num_embeddings)
            for n in range(6):
                lo, hi = int(offsets[n]), int(offsets[n + 1])
                for j, x in enumerate(values[lo:hi].tolist(), start=lo):
                    P[n, x] += float(w[j]) if weights else 1.0 / (hi - lo) if pool.get(k) == "mean" else 1.0
            expected += P.t() @ dY[k]
        torch.testing.assert_close(fused_grad(ebc, name), expected)


def test_sparse_grad_touches_only_used_rows():
    big = EmbeddingBagCollection([TableSpec("t", 100, 4, ("x",))], dense_grad_max_rows=99)
    kj = KeyedJagged.from_dense(["x"], torch.tensor([[3], [7], [3]]))
    big(kj).stacked().sum().backward()
    (w,) = big.embedding_parameters()
    assert sorted(w.grad.coalesce().indices()[0].tolist()) == [3, 7]
    assert big.sparse_grad_parameters() == [w]
    for ebc in (EmbeddingBagCollection([TableSpec("t", 100, 4, ("x",))], sparse_grad=False),
                EmbeddingBagCollection([TableSpec("t", 100, 4, ("x",))], dense_grad_max_rows=100)):
        ebc(kj).stacked().sum().backward()
        (w,) = ebc.embedding_parameters()
        assert not w.grad.is_sparse and ebc.sparse_grad_parameters() == []
        assert w.grad.ne(0).any(1).nonzero().squeeze(1).tolist() == [3, 7]


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
    with pytest.raises(IndexError, match="id 50 is outside table 'ta' of size 50"):
        ebc.lookup("ta", torch.tensor([[1, 50]]))
    # one id per bag takes the gather path; same message
    ids = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 30, 5]])
    with pytest.raises(IndexError, match="feature 'd': id 30 is outside table 'td' of size 30"):
        ebc(KeyedJagged.from_dense(list(SIZES), ids))
    ids[1, 3] = 29
    ebc(KeyedJagged.from_dense(list(SIZES), ids))  # largest valid id is fine


def test_lookup_by_table_matches_table_rows():
    ebc = EmbeddingBagCollection(TABLES)
    ids = torch.tensor([[1, 2, 0], [6, 6, 3]])
    e = ebc.lookup("tc", ids)
    assert e.shape == (2, 3, 8)
    torch.testing.assert_close(e, ebc.table_weight("tc")[ids])
    torch.testing.assert_close(ebc.lookup("td", torch.tensor([29])), ebc.table_weight("td")[29:30])
    with pytest.raises(KeyError, match="no table 'c'"):
        ebc.lookup("c", ids)  # a feature name is not a table name


def test_init_bounds_and_embedding_parameters():
    ebc = EmbeddingBagCollection(TABLES)
    for t in ebc.tables.values():
        w = ebc.table_weight(t.name)
        assert w.abs().max() <= (1.0 / t.num_embeddings) ** 0.5
    params = list(ebc.embedding_parameters())
    assert len(params) == 2 and all(isinstance(p, nn.Parameter) for p in params)  # one fused weight per dim (8, 5)
    assert {id(p) for p in params} == {id(p) for p in ebc.parameters()}
    assert len(list(copy.deepcopy(ebc).embedding_parameters())) == 2


def test_make_embeddings_from_schema_shared_tables_and_sequences():
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
    ebc = make_embeddings(schema)
    assert isinstance(ebc, EmbeddingCollection) and isinstance(ebc, EmbeddingBagCollection)
    assert ebc.keys == ["item", "cat", "tag", "item2", "hist_cat"]
    assert ebc.feature_to_table["item2"] == "item" and ebc.feature_to_table["hist_cat"] == "cat"
    assert ebc.feature_pooling["tag"] == "mean"
    assert ebc.sequence_keys == {"hist": ("item", 6)}  # the unpooled history, for sequence()
    with pytest.raises(SchemaError, match="pooling 'none'"):
        make_embeddings(schema, ["item", "hist"])
    sub = make_embeddings(schema, ["cat"])
    assert list(sub.tables) == ["cat"] and sub.sequence_keys == {}  # hist's table is not used here
    g = torch.Generator().manual_seed(6)
    sizes = {"item": 20, "cat": 5, "tag": 9, "item2": 20, "hist": 20, "hist_cat": 5}
    kj = random_kj(schema.sparse_keys, sizes, B=5, gen=g)
    d = ebc(kj).to_dict()
    for k in ebc.keys:
        torch.testing.assert_close(d[k], reference(ebc, kj, k))


# ---- sequence(): unpooled histories -----------------------------------------------------------------
SEQ_SCHEMA = Schema(
    sparse=[SparseFeature("item", 30, 4), SparseFeature("cat", 6, 4)],
    sequence=[SequenceFeature("hist", 4, "item", pooling="none")],
)


def test_sequence_matches_padding_loop_and_keeps_most_recent():
    g = torch.Generator().manual_seed(7)
    ebc = make_embeddings(SEQ_SCHEMA)
    B, T = 6, 4
    lengths = torch.tensor([0, 1, 4, 6, 3, 9])  # empty, short, exactly T, longer than T
    hist = torch.randint(1, 30, (int(lengths.sum()),), generator=g)  # no id 0: pads must not read row 0
    kj = KeyedJagged.from_per_key({
        "item": (torch.randint(0, 30, (B,), generator=g), torch.ones(B, dtype=torch.int64)),
        "cat": (torch.randint(0, 6, (B,), generator=g), torch.ones(B, dtype=torch.int64)),
        "hist": (hist, lengths),
    })
    emb, mask = ebc.sequence(kj, "hist")
    assert emb.shape == (B, T, 4) and mask.shape == (B, T) and mask.dtype == torch.bool
    table = ebc.table_weight("item")
    weights = torch.randn(B, T, 4, generator=g)
    expected_grad = torch.zeros(30, 4)
    start = 0
    for b, n in enumerate(lengths.tolist()):
        bag = hist[start : start + n].tolist()
        start += n
        kept = bag[-T:]  # the most recent T ids, oldest first
        for t in range(T):
            if t < len(kept):
                assert mask[b, t]
                torch.testing.assert_close(emb[b, t], table[kept[t]])
                expected_grad[kept[t]] += weights[b, t]
            else:
                assert not mask[b, t] and torch.all(emb[b, t] == 0)
    (emb * weights).sum().backward()
    torch.testing.assert_close(fused_grad(ebc, "item"), expected_grad)
    (w,) = ebc.embedding_parameters()
    assert not w.grad.to_dense()[0].any()  # padding touched no row
    with pytest.raises(KeyError, match="no unpooled sequence feature 'item'"):
        ebc.sequence(kj, "item")


def test_sequence_checks_ids():
    ebc = make_embeddings(SEQ_SCHEMA)
    kj = KeyedJagged.from_per_key({"hist": (torch.tensor([3, 30]), torch.tensor([2]))})
    with pytest.raises(IndexError, match="feature 'hist': id 30 is outside table 'item' of size 30"):
        ebc.sequence(kj, "hist")


# ---- state dict: one entry per table -----------------------------------------------------------------
def test_state_dict_names_tables_and_round_trips_the_fused_weights():
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(TABLES)
    sd = ebc.state_dict()
    assert list(sd) == ["tables.ta", "tables.tc", "tables.td", "tables.te"]
    for t in TABLES:
        assert sd[f"tables.{t.name}"].shape == (t.num_embeddings, t.embedding_dim)
        assert torch.equal(sd[f"tables.{t.name}"], ebc.table_weight(t.name))
    # the entries are views of the fused weights: a saved state dict holds every row once
    fused = {p.data_ptr() for p in ebc.embedding_parameters()}
    assert {v.untyped_storage().data_ptr() for v in sd.values()} == fused
    buf = io.BytesIO()
    torch.save(sd, buf)
    rows = sum(p.numel() * p.element_size() for p in ebc.embedding_parameters())
    assert rows <= buf.getbuffer().nbytes < rows + 4096

    torch.manual_seed(1)
    other = EmbeddingBagCollection(TABLES)
    assert not torch.equal(other.table_weight("ta"), ebc.table_weight("ta"))
    other.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    for p, q in zip(ebc.embedding_parameters(), other.embedding_parameters()):
        assert torch.equal(p, q)  # every row restored exactly, into the same fused Parameter objects
    assert all(isinstance(p, nn.Parameter) for p in other.embedding_parameters())


def test_load_state_dict_reports_missing_unexpected_and_bad_shapes():
    ebc = EmbeddingBagCollection(TABLES)
    sd = ebc.state_dict()
    with pytest.raises(RuntimeError, match="Missing key.*tables.tc"):
        ebc.load_state_dict({k: v for k, v in sd.items() if k != "tables.tc"})
    with pytest.raises(RuntimeError, match="Unexpected key.*weights.dim8"):
        ebc.load_state_dict({**sd, "weights.dim8": torch.zeros(1)})
    with pytest.raises(RuntimeError, match="size mismatch for tables.tc"):
        ebc.load_state_dict({**sd, "tables.tc": torch.zeros(8, 8)})
    result = ebc.load_state_dict({k: v for k, v in sd.items() if k != "tables.tc"}, strict=False)
    assert result.missing_keys == ["tables.tc"]


def test_model_state_dict_names_tables():
    schema = Schema(
        dense=[DenseFeature("d")],
        sparse=[SparseFeature("user", 9, 4), SparseFeature("item", 7, 4), SparseFeature("item2", 7, 4, table="item")],
    )
    torch.manual_seed(0)
    model = create_model("deepfm", schema, dnn_hidden=(3,))
    sd = model.state_dict()
    tables = sorted(k for k in sd if ".tables." in k)
    assert tables == ["embedding.ebc.tables.item", "embedding.ebc.tables.user",
                      "linear.ebc.tables.item", "linear.ebc.tables.user"]
    assert sd["embedding.ebc.tables.item"].shape == (7, 4) and sd["linear.ebc.tables.user"].shape == (9, 1)
    assert not any("fused" in k or "weights.dim" in k for k in sd)
    torch.manual_seed(1)
    again = create_model("deepfm", schema, dnn_hidden=(3,))
    again.load_state_dict(sd)
    for p, q in zip(model.parameters(), again.parameters()):
        assert torch.equal(p, q)


# ---- make_embeddings options -------------------------------------------------------------------------
OPT_SCHEMA = Schema(sparse=[SparseFeature("a", 400, 8), SparseFeature("b", 25, 8),
                            SparseFeature("c", 3000, 5, multi_valued=True, pooling="mean")])


def test_make_embeddings_width_override_keeps_tables_rows_and_poolings():
    ebc = make_embeddings(OPT_SCHEMA, dim=3)
    assert [(t.name, t.num_embeddings, t.embedding_dim) for t in ebc.tables.values()] == [
        ("a", 400, 3), ("b", 25, 3), ("c", 3000, 3)]
    assert ebc.dims == [3, 3, 3] and ebc.feature_pooling["c"] == "mean"
    assert len(list(ebc.embedding_parameters())) == 1  # one width: one fused weight


def test_make_embeddings_inits():
    torch.manual_seed(0)
    uni = make_embeddings(OPT_SCHEMA)
    for t in uni.tables.values():
        w = uni.table_weight(t.name)
        bound = (1.0 / t.num_embeddings) ** 0.5
        assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound  # fills U(-bound, bound)
    after_uniform = torch.rand(3)
    torch.manual_seed(0)
    zeros = make_embeddings(OPT_SCHEMA, init="zeros")
    assert all(not p.any() for p in zeros.embedding_parameters())
    # zeros draws (and drops) the uniform values: parameters created after it see the same random stream
    torch.testing.assert_close(torch.rand(3), after_uniform)
    normal = make_embeddings(OPT_SCHEMA, init="normal", std=0.01)
    w = normal.table_weight("c").detach()
    assert abs(float(w.std()) - 0.01) < 0.001 and abs(float(w.mean())) < 0.001
    with pytest.raises(ValueError, match="'normal' needs a positive std"):
        make_embeddings(OPT_SCHEMA, init="normal")
    with pytest.raises(ValueError, match="init 'xavier' is not one of"):
        make_embeddings(OPT_SCHEMA, init="xavier")


def test_make_embeddings_from_explicit_tables():
    specs = [TableSpec("tree0", 4, 1, ("tree0",)), TableSpec("tree1", 4, 1, ("tree1",))]
    ebc = make_embeddings(tables=specs, init="zeros")
    assert ebc.keys == ["tree0", "tree1"] and ebc.feature_pooling == {"tree0": "sum", "tree1": "sum"}
    wide = make_embeddings(tables=specs, dim=6)
    assert wide.dims == [6, 6]
    with pytest.raises(ValueError, match="exactly one of schema= and tables="):
        make_embeddings(OPT_SCHEMA, tables=specs)
    with pytest.raises(ValueError, match="keys= and sequence_keys= go with schema="):
        make_embeddings(tables=specs, keys=["tree0"])
    with pytest.raises(ValueError, match="backend 'sharded' is not available; supported: fused, torchrec"):
        make_embeddings(OPT_SCHEMA, backend="sharded")


def test_interface_is_abstract_and_the_fused_backend_implements_it():
    with pytest.raises(TypeError, match="abstract"):
        EmbeddingCollection()
    ebc = make_embeddings(tables=TABLES[:2])
    assert isinstance(ebc, EmbeddingCollection)
    kj = random_kj(["a", "b", "c"], SIZES, B=3, gen=torch.Generator().manual_seed(8))
    torch.testing.assert_close(ebc(kj).stacked(), ebc.pooled(kj).stacked())  # forward is pooled
