"""The cross, deep-FM and attention models of the zoo (dcn, dcnv2, deepfm, xdeepfm, nfm, afm, fibinet,
autoint): bad options give ConfigErrors naming model and option, and each model's logit equals a hand
computation (loops) from its own weights on a tiny config. Their contract variants are in contract_cases.py."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import contract_schema

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.models.base import logits_of
from ctrkit.models.registry import ConfigError, create_model
from ctrkit.schema import DenseFeature, Schema, SparseFeature

B, D = 4, 4
KEYS = ["s0", "s1", "s2"]
PAIRS = list(itertools.combinations(range(len(KEYS)), 2))


def tiny_schema(dims: tuple[int, ...] = (D, D, D), num_dense: int = 2) -> Schema:
    return Schema(
        dense=[DenseFeature(f"d{i}") for i in range(num_dense)],
        sparse=[SparseFeature(k, v, d) for k, v, d in zip(KEYS, (7, 5, 6), dims)],
    )


def tiny_batch(num_dense: int = 2, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randint(0, v, (B,), generator=g) for v in (7, 5, 6)], dim=1)  # (B, F)
    return Batch(dense=torch.randn(B, num_dense, generator=g), sparse=KeyedJagged.from_dense(KEYS, ids),
                 labels=torch.zeros(B))


def ids_of(batch: Batch) -> list[list[int]]:
    return [[int(batch.sparse[k][0][b]) for k in KEYS] for b in range(B)]


def rows(ebc, ids: list[int]) -> list[torch.Tensor]:
    """Embedding vectors of one row's ids, read straight from the tables (table name = feature name)."""
    return [ebc.table_weight(k)[i] for k, i in zip(KEYS, ids)]


def build(name: str, schema: Schema | None = None, **params) -> torch.nn.Module:
    torch.manual_seed(0)
    model = create_model(name, schema or tiny_schema(), **params)
    with torch.no_grad():  # zero-initialised parts (first-order weights, biases) made non-trivial
        for p in model.parameters():
            if not p.any():
                p.normal_(0, 0.3)
    return model.eval()


def linear_ref(model: torch.nn.Module, batch: Batch, b: int) -> torch.Tensor:
    """First-order part by hand: bias + Σ_f w[id_f] + Σ_m w_m x_m."""
    lt = model.linear
    out = sum(w[0] for w in rows(lt.ebc, ids_of(batch)[b]))
    out = out + sum(lt.dense.weight[0, m] * batch.dense[b, m] for m in range(batch.dense.shape[1]))
    return out + (lt.bias[0] if lt.bias is not None else 0.0)


def mlp_ref(mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """ReLU MLP on one vector, from its Linear weights (no BN / dropout in these configs)."""
    for m in mlp.layers:
        if isinstance(m, torch.nn.Linear):
            x = m.weight @ x + m.bias
        else:
            x = torch.relu(x)
    return x


# ------------------------------------------------------------------------------------------ bad options
@pytest.mark.parametrize(
    "name, params, pattern",
    [
        ("dcn", {"cross_layers": 0}, r"dcn: option cross_layers must be >= 1"),
        ("dcn", {"dnn_activation": "relux"}, r"dcn: bad dnn_hidden / dnn_activation.*relux"),
        ("dcnv2", {"cross_type": "vector"}, r"dcnv2: unknown cross_type='vector'.*full, low_rank_mixture"),
        ("dcnv2", {"structure": "stack"}, r"dcnv2: unknown structure='stack' \(did you mean 'stacked'\?\)"),
        ("dcnv2", {"cross_type": "low_rank_mixture", "cross_rank": 0}, r"dcnv2: option cross_rank must be >= 1"),
        ("dcnv2", {"cross_type": "low_rank_mixture", "cross_activation": "nope"}, r"dcnv2: bad cross_activation"),
        ("xdeepfm", {"cin_layer_sizes": (3, 4), "split_half": True}, r"xdeepfm: bad cin_layer_sizes / split_half"),
        ("xdeepfm", {"cin_activation": "softmax"}, r"xdeepfm: bad .*cin_activation.*softmax"),
        ("nfm", {"bi_dropout": 1.0}, r"nfm: option bi_dropout must be in \[0, 1\)"),
        ("afm", {"att_dim": 0}, r"afm: option att_dim must be >= 1"),
        ("fibinet", {"senet_pooling": "sum"}, r"fibinet: unknown senet_pooling='sum'.*mean, max"),
        ("fibinet", {"reduction_ratio": 0.0}, r"fibinet: bad reduction_ratio"),
        ("autoint", {"autoint_plus": True, "dnn_hidden": ()}, r"autoint: autoint_plus=True needs .*dnn_hidden"),
    ],
)
def test_bad_option_is_config_error(name, params, pattern):
    with pytest.raises(ConfigError, match=pattern):
        create_model(name, tiny_schema(), **params)


def test_autoint_head_dim_too_small():
    with pytest.raises(ConfigError, match=r"autoint: bad num_heads / head_dim.*head_dim must be >= 1"):
        create_model("autoint", tiny_schema(), num_heads=5)  # D=4 // 5 = 0


def test_fibinet_unknown_bilinear_type_lists_valid_ones():
    with pytest.raises(ConfigError, match="fibinet: unknown bilinear_type='bilinear'") as info:
        create_model("fibinet", tiny_schema(), bilinear_type="bilinear")
    for valid in ("field_all", "field_each", "field_interaction"):
        assert valid in str(info.value)


@pytest.mark.parametrize("name", ["afm", "fibinet", "nfm"])
def test_single_sparse_field_is_config_error(name):
    schema = Schema(dense=[DenseFeature("d0")], sparse=[SparseFeature("only", 10, D)])
    with pytest.raises(ConfigError, match=rf"{name} needs at least 2 sparse fields.*only"):
        create_model(name, schema)


@pytest.mark.parametrize("name", ["deepfm", "xdeepfm", "nfm", "afm", "fibinet", "autoint"])
def test_unequal_embedding_dims_is_config_error(name):
    with pytest.raises(ConfigError, match=rf"{name} needs one embedding dim for every field"):
        create_model(name, tiny_schema(dims=(4, 4, 6)))


@pytest.mark.parametrize("name", ["dcn", "dcnv2"])
def test_cross_models_accept_unequal_dims(name):
    model = build(name, tiny_schema(dims=(2, 3, 5)), dnn_hidden=(3,))
    assert model.cross.in_features == 2 + 3 + 5 + 2
    assert logits_of(model(tiny_batch())).shape == (B,)


# ------------------------------------------------------------------------------------- hand computations
def test_deepfm_is_first_order_plus_fm_pairs_plus_dnn():
    model = build("deepfm", dnn_hidden=(5,))
    assert model.linear.bias is None and model.deep.out.bias is None  # seed: no bias in the heads
    batch = tiny_batch()
    out = logits_of(model(batch))
    for b in range(B):
        e = rows(model.embedding.ebc, ids_of(batch)[b])
        second = sum(sum(e[i][d] * e[j][d] for d in range(D)) for i, j in PAIRS)
        dnn = model.deep.out.weight[0] @ mlp_ref(model.deep.tower, torch.cat([*e, batch.dense[b]]))
        ref = linear_ref(model, batch, b) + second + dnn + model.bias[0]
        torch.testing.assert_close(out[b], ref, rtol=1e-5, atol=1e-5)


def test_deepfm_without_bias_has_no_global_bias():
    model = build("deepfm", dnn_hidden=(), bias=False)
    assert model.bias is None and all(p.numel() for p in model.parameters())
    names = {n for n, _ in model.named_parameters()}
    assert not any(n.endswith("bias") for n in names), names


def test_dcn_one_layer_equals_loop_reference():
    model = build("dcn", cross_layers=1, dnn_hidden=(3,))
    batch = tiny_batch()
    out = logits_of(model(batch))
    w, bias = model.cross.kernels[0][:, 0], model.cross.bias[0][:, 0]  # (N,), (N,)
    for b in range(B):
        x0 = torch.cat([*rows(model.embedding.ebc, ids_of(batch)[b]), batch.dense[b]])  # (N,)
        n = len(x0)
        dot = sum(x0[k] * w[k] for k in range(n))
        x1 = torch.stack([x0[i] * dot + bias[i] + x0[i] for i in range(n)])
        z = torch.cat([x1, mlp_ref(model.head.tower, x0)])
        ref = sum(model.head.out.weight[0, k] * z[k] for k in range(len(z))) + model.head.out.bias[0]
        torch.testing.assert_close(out[b], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("structure", ["stacked", "parallel"])
def test_dcnv2_matrix_one_layer_equals_loop_reference(structure):
    model = build("dcnv2", cross_type="full", cross_layers=1, structure=structure, dnn_hidden=(3,))
    batch = tiny_batch()
    out = logits_of(model(batch))
    W, bias = model.cross.kernels[0], model.cross.bias[0][:, 0]
    for b in range(B):
        x0 = torch.cat([*rows(model.embedding.ebc, ids_of(batch)[b]), batch.dense[b]])
        n = len(x0)
        x1 = torch.stack([x0[i] * (sum(W[i, k] * x0[k] for k in range(n)) + bias[i]) + x0[i] for i in range(n)])
        z = mlp_ref(model.head.tower, x1) if structure == "stacked" else torch.cat([x1, mlp_ref(model.head.tower, x0)])
        assert model.head.out.in_features == len(z)
        torch.testing.assert_close(out[b], model.head.out.weight[0] @ z + model.head.out.bias[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("split_half, sizes, width, act", [(True, (4, 3), 2 + 3, "identity"),
                                                        (False, (4, 3), 4 + 3, "identity"), (True, (4, 3), 2 + 3, "relu")])
def test_xdeepfm_is_linear_plus_cin_plus_dnn(split_half, sizes, width, act):
    model = build("xdeepfm", cin_layer_sizes=sizes, split_half=split_half, cin_activation=act, dnn_hidden=(5,))
    assert model.cin_out.in_features == width
    assert model.cin_out.bias is None and model.deep.out.bias is None and model.linear.bias is not None
    batch = tiny_batch()
    out = logits_of(model(batch))
    emb = model.embedding(batch)
    cin = model.cin_out(model.cin(emb))[:, 0]
    for b in range(B):
        e = rows(model.embedding.ebc, ids_of(batch)[b])
        dnn = model.deep.out.weight[0] @ mlp_ref(model.deep.tower, torch.cat([*e, batch.dense[b]]))
        torch.testing.assert_close(out[b], linear_ref(model, batch, b) + cin[b] + dnn, rtol=1e-5, atol=1e-5)


def test_nfm_bi_interaction_batchnorm_dnn_plus_linear():
    model = build("nfm", dnn_hidden=(5,))
    assert isinstance(model.bn, torch.nn.BatchNorm1d) and model.bn.num_features == D + 2
    assert model.deep.out.bias is None and model.linear.bias is not None  # seed: DNN head no bias
    with torch.no_grad():  # non-trivial running statistics so the BN visibly acts
        model.bn.running_mean.normal_()
        model.bn.running_var.uniform_(0.5, 2.0)
    batch = tiny_batch()
    out = logits_of(model(batch))
    bn = model.bn
    for b in range(B):
        e = rows(model.embedding.ebc, ids_of(batch)[b])
        bi = sum(e[i] * e[j] for i, j in PAIRS)  # (D,)
        z = torch.cat([bi, batch.dense[b]])
        z = (z - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * bn.weight + bn.bias
        ref = linear_ref(model, batch, b) + model.deep.out.weight[0] @ mlp_ref(model.deep.tower, z)
        torch.testing.assert_close(out[b], ref, rtol=1e-5, atol=1e-5)


def test_afm_attention_pooling_plus_linear():
    model = build("afm", att_dim=3)
    att = model.attention
    batch = tiny_batch()
    out = logits_of(model(batch))
    weights = att.pool(model.embedding(batch))[1]  # (B, P)
    torch.testing.assert_close(weights.sum(1), torch.ones(B))
    for b in range(B):
        e = rows(model.embedding.ebc, ids_of(batch)[b])
        prods = [e[i] * e[j] for i, j in PAIRS]
        scores = torch.stack([att.h @ torch.relu(att.attention.weight @ p + att.attention.bias) for p in prods])
        a = torch.exp(scores) / torch.exp(scores).sum()
        torch.testing.assert_close(weights[b], a, rtol=1e-5, atol=1e-6)
        pooled = sum(a[k] * prods[k] for k in range(len(prods)))
        ref = linear_ref(model, batch, b) + att.projection @ pooled
        torch.testing.assert_close(out[b], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bilinear_type", ["field_all", "field_each", "field_interaction"])
@pytest.mark.parametrize("pooling", ["mean", "max"])
@pytest.mark.parametrize("shared", [False, True])
def test_fibinet_equals_loop_reference(bilinear_type, pooling, shared):
    model = build("fibinet", bilinear_type=bilinear_type, senet_pooling=pooling, reduction_ratio=2.0,
                  dnn_hidden=(), bilinear_shared=shared)
    if shared:  # one layer for both (DeepCTR-Torch's form)
        assert model.bilinear_senet is None
    else:
        assert model.bilinear_raw.weight.data_ptr() != model.bilinear_senet.weight.data_ptr()
    senet_layer = model.bilinear_raw if shared else model.bilinear_senet
    batch = tiny_batch()
    out = logits_of(model(batch))
    w1, w2 = model.senet.excite[0].weight, model.senet.excite[2].weight

    def bilinear(weight: torch.Tensor, v: list[torch.Tensor]) -> list[torch.Tensor]:
        out = []
        for p, (i, j) in enumerate(PAIRS):
            W = weight if bilinear_type == "field_all" else weight[i] if bilinear_type == "field_each" else weight[p]
            out.append(torch.stack([sum(v[i][d] * W[d, c] for d in range(D)) for c in range(D)]) * v[j])
        return out

    for b in range(B):
        e = rows(model.embedding.ebc, ids_of(batch)[b])
        z = torch.stack([x.mean() if pooling == "mean" else x.max() for x in e])  # (F,)
        a = torch.relu(w2 @ torch.relu(w1 @ z))
        v = [a[f] * e[f] for f in range(len(e))]
        h = torch.cat([*bilinear(model.bilinear_raw.weight, e), *bilinear(senet_layer.weight, v),
                       batch.dense[b]])
        ref = linear_ref(model, batch, b) + model.deep.out.weight[0] @ h
        torch.testing.assert_close(out[b], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("plus", [False, True])
def test_autoint_dense_fields_attention_and_head(plus):
    model = build("autoint", num_layers=2, num_heads=2, head_dim=3, autoint_plus=plus, dnn_hidden=(5,))
    fields = len(KEYS) + 2
    assert model.head.out.in_features == fields * 6 + (5 if plus else 0)
    assert (model.head.tower is not None) == plus
    batch = tiny_batch()
    out = logits_of(model(batch))
    for b in range(B):
        e = rows(model.embedding.ebc, ids_of(batch)[b])
        dense_fields = [batch.dense[b, m] * model.dense_vectors[m] for m in range(2)]  # e_m = v_m x_m
        x = torch.stack([*e, *dense_fields]).unsqueeze(0)  # (1, M, D)
        for layer in model.attention:
            x = layer(x)
        parts = [x.flatten()]
        if plus:
            parts.append(mlp_ref(model.head.tower, torch.cat([*e, batch.dense[b]])))
        ref = model.head.out.weight[0] @ torch.cat(parts) + model.head.out.bias[0]
        torch.testing.assert_close(out[b], ref, rtol=1e-5, atol=1e-5)


def test_autoint_uses_dense_features():
    model = build("autoint", num_layers=1)
    batch = tiny_batch()
    other = Batch(dense=batch.dense + 1.0, sparse=batch.sparse, labels=batch.labels)
    assert not torch.allclose(logits_of(model(batch)), logits_of(model(other)))


@pytest.mark.parametrize("name", ["dcn", "dcnv2", "deepfm", "xdeepfm", "nfm", "afm", "fibinet", "autoint"])
def test_contract_schema_builds_with_defaults(name):
    """Default hyper-parameters build on the contract schema (multi-valued and sequence fields)."""
    model = create_model(name, contract_schema())
    assert sum(p.numel() for p in model.parameters()) > 0
