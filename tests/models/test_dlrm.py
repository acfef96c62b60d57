"""DLRM: the dot-interaction logit equals a hand computation from its arches; its contract variants."""

from __future__ import annotations

import torch
from conftest import contract_schema, make_batch, planted_data

from ctrkit.models.registry import create_model

SMALL = {"dense_arch": (16,), "over_arch": (16,)}

# Variants exercised by test_models_contract.py (small sizes keep the suite fast): every interaction arch.
CONTRACT_VARIANTS: dict[str, list[dict]] = {
    "dlrm": [
        dict(SMALL, interaction="dot"),
        dict(SMALL, interaction="dcn", dcn_type="full", dcn_layers=2),
        dict(SMALL, interaction="dcn", dcn_type="low_rank", dcn_layers=2, dcn_rank=4),
        dict(SMALL, interaction="dcn", dcn_type="vector", dcn_layers=2),
        dict(SMALL, interaction="dcn", dcn_type="low_rank_mixture", dcn_layers=2, dcn_rank=4, dcn_experts=2),
        dict(SMALL, interaction="projection", projection_branch1=(16, 3 * 8), projection_branch2=(16, 2 * 8)),
    ],
}


def test_dot_interaction_logit_by_hand():
    """logit = over_arch([d, (c_i . c_j for i < j)]) with c_0 = dense_arch(x), c_f+1 = pooled feature f."""
    torch.manual_seed(0)
    schema = contract_schema()
    model = create_model("dlrm", schema, **CONTRACT_VARIANTS["dlrm"][0]).eval()
    batch = make_batch(planted_data(16, seed=2), slice(0, 16))
    with torch.no_grad():
        d = model.dense_arch(batch.dense)  # (B, D)
        logits = model(batch)
        expected = []
        kj = batch.sparse.select(model.sparse_keys)
        emb = model.sparse_arch(kj).stacked()  # (B, F, D)
        for b in range(16):
            vecs = [d[b]] + [emb[b, f] for f in range(emb.shape[1])]
            pairs = [torch.dot(vecs[i], vecs[j]) for i in range(len(vecs)) for j in range(i + 1, len(vecs))]
            z = torch.cat([d[b], torch.stack(pairs)])
            expected.append(model.over_arch(z[None])[0, 0])
    torch.testing.assert_close(logits, torch.stack(expected), rtol=1e-5, atol=1e-5)
