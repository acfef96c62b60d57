"""Warm start over every registered model (issue 28 item 2), both embedding backends: a model built for a grown
vocabulary (every table with more rows, known ids unchanged) and loaded from a trained checkpoint of the old one
scores every row made of known ids exactly as the checkpoint's model does, and its new rows are those a fresh model
of the new vocabulary starts from (same seed)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import make_batch
from contract_cases import VARIANTS, build, data_for, schema_for

from ctrkit.checkpoint import Checkpoint
from ctrkit.models.base import logits_of
from ctrkit.models.registry import list_models
from ctrkit.nn.embedding_interface import EmbeddingCollection
from ctrkit.nn.embedding_torchrec import torchrec_available
from ctrkit.schema import Schema
from ctrkit.training.config import TrainConfig
from ctrkit.training.optim import build_optimizers
from ctrkit.training.tasks import CTRTask
from ctrkit.training.warm_start import load_grown_weights


def grown(schema: Schema) -> Schema:
    """``schema`` with every sparse feature's vocabulary grown by a different number of ids (3, 4, 5, ...)."""
    return replace(schema, sparse=[replace(f, vocab_size=f.vocab_size + 3 + i) for i, f in enumerate(schema.sparse)])


def trained(name: str, params: dict, steps: int = 3):
    """The model of the contract case after a few Adam / Adagrad steps (weights away from their initial values)."""
    data, schema = data_for(name), schema_for(name)
    model = build(name, params, data=data)
    opt, task = build_optimizers(model, TrainConfig(lr=0.05)), CTRTask().bind(model)
    model.train()
    for s in range(steps):
        opt.zero_grad()
        task.loss(model, make_batch(data, slice(64 * s, 64 * (s + 1)), schema))[0].backward()
        opt.step()
    return model.eval()


def tables(model) -> dict[str, torch.Tensor]:
    return {f"{p}.{t}" if p else t: m.table_weight(t).detach().clone() for p, m in model.named_modules()
            if isinstance(m, EmbeddingCollection) for t in m.tables}


BACKENDS = ["fused", pytest.param("torchrec", marks=pytest.mark.skipif(not torchrec_available(),
                                                                          reason="torchrec is not installed"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list_models())
def test_known_rows_score_as_before_and_new_rows_start_fresh(name, backend):
    params = {**VARIANTS.get(name, [{}])[0], "embedding_backend": backend}
    data, schema = data_for(name), schema_for(name)
    old = trained(name, params)
    ckpt = Checkpoint.of(old, schema=schema, model_params=params)
    torch.manual_seed(7)
    from ctrkit.models.registry import create_model

    new = create_model(name, grown(schema), **params)  # no prefit: the fitted parts come from the checkpoint
    fresh = {k: v.clone() for k, v in tables(new).items()}
    sizes = load_grown_weights(new, ckpt, params)
    rows = {t.num_embeddings: grown(schema).tables()[n].num_embeddings for n, t in schema.tables().items()}
    for key, (a, b) in sizes.items():  # tables of the schema's ids grew (NCF's role tables too); GBDT+LR's leaves,
        assert b == rows.get(a, a), (key, a, b)  # Wide & Deep's hashed crosses keep their size
    new.eval()
    batch = make_batch(data, slice(0, 200), schema)  # ids of the old vocabulary only
    with torch.no_grad():
        torch.testing.assert_close(logits_of(new(batch)), logits_of(old(batch)), rtol=0, atol=0)
    before = tables(old)
    for key, w in tables(new).items():
        n = before[key].shape[0]
        assert torch.equal(w[:n], before[key]), f"{name}: {key} old rows changed"
        assert torch.equal(w[n:], fresh[key][n:]), f"{name}: {key} new rows are not the fresh model's"
