"""The torchrec embedding backend (nn/embedding_torchrec.py) against the fused backend: the same model built with
either backend, the fused weights loaded into the torchrec one (same state-dict names), gives the same outputs and
the same table gradients; ids out of range are errors naming the feature, as in the fused backend."""

from __future__ import annotations

import pytest
import torch
from conftest import make_batch
from models.contract_cases import VARIANTS, build, data_for, schema_for

from ctrkit.errors import IdOutOfRangeError
from ctrkit.models.base import logits_of
from ctrkit.nn.embedding_interface import EmbeddingCollection
from ctrkit.nn.embedding_torchrec import TorchrecEmbeddingCollection, torchrec_available

pytestmark = pytest.mark.skipif(not torchrec_available(), reason="torchrec is not installed (ctrkit[distributed], "
                                "see the Makefile's install step)")

# pooled fields (dlrm, deepfm, lr, ncf), histories (din, dien with its negatives, bst), lookups (youtube_dnn, two_tower)
MODELS = ["dlrm", "deepfm", "lr", "ncf", "din", "dien", "bst", "youtube_dnn", "two_tower"]


def pair(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    params = VARIANTS[name][0]
    fused = build(name, params, seed=3)
    trec = build(name, {**params, "embedding_backend": "torchrec"}, seed=4)
    assert any(isinstance(m, TorchrecEmbeddingCollection) for m in trec.modules())
    assert trec.state_dict().keys() == fused.state_dict().keys()  # tables.<name> whatever the backend
    trec.load_state_dict(fused.state_dict())
    return fused, trec


def table_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each table's gradient [rows, D] (fused: the rows of its fused weight's sparse gradient)."""
    out = {}
    for prefix, m in model.named_modules():
        if not isinstance(m, EmbeddingCollection):
            continue
        if isinstance(m, TorchrecEmbeddingCollection):
            for t, w in m.table_weights().items():
                out[f"{prefix}.{t}"] = w.grad.to_dense() if w.grad is not None else torch.zeros_like(w)
        else:
            for t in m.tables:
                p = m._fused(m.tables[t].embedding_dim)
                g = p.grad.to_dense() if p.grad is not None else torch.zeros_like(p)
                o = m.row_offset[t]
                out[f"{prefix}.{t}"] = g[o: o + m.tables[t].num_embeddings]
    return out


@pytest.mark.parametrize("name", MODELS)
def test_same_outputs_and_table_gradients_as_the_fused_backend(name):
    fused, trec = pair(name)
    data, schema = data_for(name), schema_for(name)
    batch = make_batch(data, slice(0, 48), schema)
    fused.eval(), trec.eval()  # dropout off; the comparison is of the embeddings, not of the random masks
    a, b = logits_of(fused(batch)), logits_of(trec(batch))
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    a.sum().backward()
    b.sum().backward()
    ga, gb = table_grads(fused), table_grads(trec)
    assert ga.keys() == gb.keys() and ga
    for k in ga:
        torch.testing.assert_close(gb[k], ga[k], rtol=1e-5, atol=1e-6, msg=f"gradient of table {k}")
    assert any(g.abs().sum() > 0 for g in gb.values())


def test_tables_shared_by_pooled_fields_and_histories_are_unpooled_collections():
    _, trec = pair("din")
    emb = next(m for m in trec.modules() if isinstance(m, TorchrecEmbeddingCollection))
    seq_tables = {t for t, _ in emb.sequence_keys.values()}
    assert seq_tables and set(emb._seq_tables) >= seq_tables
    assert not set(emb._bag_tables) & seq_tables


def test_an_id_out_of_range_names_the_feature():
    _, trec = pair("deepfm")
    schema = schema_for("deepfm")
    batch = make_batch(data_for("deepfm"), slice(0, 8), schema)
    key = batch.sparse.keys[0]
    batch.sparse.values[0] = 10**6
    with pytest.raises(IdOutOfRangeError, match=f"feature {key!r}: id 1000000 is outside table"):
        trec(batch)
