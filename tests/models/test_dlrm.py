"""DLRM: the dot-interaction logit equals a hand computation from its arches, with and without dense features
(each interaction, against loops). Its contract variants are in contract_cases.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import contract_schema, make_batch, planted_data
from contract_cases import DLRM, DLRM_SMALL

from ctrkit.errors import LayerConfigError
from ctrkit.models.base import logits_of
from ctrkit.models.registry import ConfigError, create_model
from ctrkit.nn.interaction import DotInteraction
from ctrkit.schema import Schema, SparseFeature


def test_dot_interaction_logit_by_hand():
    """logit = over_arch([d, (c_i . c_j for i < j)]) with c_0 = dense_arch(x), c_f+1 = pooled feature f."""
    torch.manual_seed(0)
    schema = contract_schema()
    model = create_model("dlrm", schema, **DLRM["dlrm"][0]).eval()
    batch = make_batch(planted_data(16, seed=2), slice(0, 16))
    with torch.no_grad():
        d = model.dense_arch(batch.dense)  # (B, D)
        logits = logits_of(model(batch))
        expected = []
        kj = batch.sparse.select(model.sparse_keys)
        emb = model.sparse_arch(kj).stacked()  # (B, F, D)
        for b in range(16):
            vecs = [d[b]] + [emb[b, f] for f in range(emb.shape[1])]
            pairs = [torch.dot(vecs[i], vecs[j]) for i in range(len(vecs)) for j in range(i + 1, len(vecs))]
            z = torch.cat([d[b], torch.stack(pairs)])
            expected.append(model.over_arch(z[None])[0, 0])
    torch.testing.assert_close(logits, torch.stack(expected), rtol=1e-5, atol=1e-5)


# ---- without dense features: no DenseArch, the interaction runs over the F sparse vectors alone ----------
NO_DENSE = {  # interaction variants checked without dense features
    "dot": dict(DLRM_SMALL, interaction="dot"),
    "dcn": dict(DLRM_SMALL, interaction="dcn", cross_type="full", cross_layers=2),
    "projection": dict(DLRM_SMALL, interaction="projection", projection_branch1=(16, 3 * 8),
                       projection_branch2=(16, 2 * 8)),
}


def no_dense_schema() -> Schema:
    s = contract_schema()
    return Schema(dense=[], sparse=s.sparse, sequence=s.sequence)


def no_dense_data(n: int, seed: int) -> dict:
    """Planted rows (labels follow item / user ids, and a dense value the model does not see), no dense column."""
    data = planted_data(n, seed=seed)
    return dict(data, dense=data["dense"][:, :0])


def naive_pooled(model, schema: Schema, data: dict, b: int) -> list[torch.Tensor]:
    """Row ``b``'s pooled vector of every key, from the table weights by hand (sum or mean of the ids' rows)."""
    out = []
    for key in model.sparse_keys:
        w = model.sparse_arch.table_weight(schema.table_of(key))
        if key + ".lengths" in data:
            offs = np.concatenate([[0], np.cumsum(data[key + ".lengths"])])
            ids = data[key][offs[b]:offs[b + 1]]
        else:
            ids = data[key][b:b + 1]
        rows = w[torch.as_tensor(np.asarray(ids, np.int64))]
        mean = schema.feature(key).pooling == "mean"
        out.append(rows.mean(0) if mean and len(ids) else rows.sum(0))
    return out


def naive_no_dense_logit(model, interaction: str, e: list[torch.Tensor]) -> torch.Tensor:
    """The over arch on the interaction of the F vectors ``e`` (D each), written out by loops."""
    inter = model.interaction_arch
    F, D = len(e), e[0].shape[0]
    if interaction == "dot":  # s_i . s_j for i < j: nothing stands in for the dense vector
        z = torch.stack([torch.dot(e[i], e[j]) for i in range(F) for j in range(i + 1, F)])
    elif interaction == "dcn":  # full cross net over x0 = [s_0, ..., s_F-1]: x <- x0 * (W x + b) + x
        x0 = torch.cat(e)
        z = x0
        for w, bias in zip(inter.crossnet.kernels, inter.crossnet.bias):
            z = x0 * (w @ z + bias.view(-1)) + z
    else:  # projection: Y (F1, D) and Z (D, F2) from the flat sparse vectors; out = flat(Y Z) alone
        flat = torch.cat(e)[None]
        y = inter.branch1(flat).view(inter.F1, D)
        zz = inter.branch2(flat).view(D, inter.F2)
        z = torch.stack([sum(y[i, k] * zz[k, j] for k in range(D)) for i in range(inter.F1) for j in range(inter.F2)])
    return model.over_arch(z[None])[0, 0]


@pytest.mark.parametrize("interaction", list(NO_DENSE))
def test_without_dense_features_logits_match_a_naive_computation_and_it_learns(interaction):
    schema = no_dense_schema()
    torch.manual_seed(0)
    model = create_model("dlrm", schema, **NO_DENSE[interaction])
    assert model.dense_arch is None
    F, D = len(model.sparse_keys), 8
    want_width = {"dot": F * (F - 1) // 2, "dcn": F * D, "projection": 3 * 2}[interaction]
    assert model.interaction_arch.out_features == want_width
    data = no_dense_data(1200, seed=3)
    batch = make_batch(data, slice(0, 12), schema)
    assert batch.dense.shape == (12, 0)
    model.eval()
    with torch.no_grad():
        logits = logits_of(model(batch))
        want = torch.stack([naive_no_dense_logit(model, interaction, naive_pooled(model, schema, data, b))
                            for b in range(12)])
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
    # it trains: the loss falls and stays finite
    model.train()
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("sparse_arch")]
    opts = [torch.optim.Adam(dense_params, lr=1e-2), torch.optim.Adagrad(list(model.embedding_parameters()), lr=0.1)]
    rows = make_batch(data, slice(0, 1000), schema)
    losses = []
    for _ in range(40):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits_of(model(rows)), rows.labels)
        for o in opts:
            o.zero_grad()
        loss.backward()
        for o in opts:
            o.step()
        losses.append(loss.item())
    assert np.isfinite(losses).all() and losses[-1] < 0.8 * losses[0], losses[::8]


def test_without_dense_features_dot_needs_two_sparse_features():
    one = Schema(dense=[], sparse=[SparseFeature("item", 40, 8)])
    with pytest.raises(ConfigError, match="at least two sparse features.*'dcn' or 'projection'"):
        create_model("dlrm", one, **NO_DENSE["dot"])
    for interaction in ("dcn", "projection"):  # these work on one vector
        model = create_model("dlrm", one, **NO_DENSE[interaction])
        out = logits_of(model(make_batch(no_dense_data(8, 0), slice(0, 8), one)))
        assert out.shape == (8,) and torch.isfinite(out).all()
    with pytest.raises(LayerConfigError, match="with_dense=False: it expects dense=None"):
        DotInteraction(3, 8, with_dense=False)(torch.zeros(2, 8), torch.zeros(2, 3, 8))
    with pytest.raises(LayerConfigError, match="got dense=None"):
        DotInteraction(3, 8)(None, torch.zeros(2, 3, 8))
