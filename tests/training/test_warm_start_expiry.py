"""Warm start over an expired vocabulary (``preprocess --grow --expire-after N``): the lineage check accepts an
evicted value only where the new vocabulary records its id as reset, and the rows of those ids, their optimizer
states and their rows of per-id buffers start as a fresh model's / optimizer's, on both embedding backends, while
every other row keeps the checkpoint's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import behaviour_schema, contract_schema, make_batch, planted_data
from warm_cases import TRCH, trained_checkpoint

from ctrkit.data.pipeline.vocab import VocabBuilder, Vocabulary
from ctrkit.data.pipeline.vocab_grow import grow_vocabulary
from ctrkit.data.storage.agree import Vocabularies
from ctrkit.data.storage.lineage import check_grown
from ctrkit.errors import StoreError
from ctrkit.models.base import logits_of
from ctrkit.models.registry import create_model
from ctrkit.nn.embedding_interface import EmbeddingCollection
from ctrkit.training.config import TrainConfig
from ctrkit.training.optim import build_optimizers
from ctrkit.training.warm_start import load_grown_optimizer, load_grown_weights, table_layout


# ---- the lineage check -----------------------------------------------------------------------------------------
def vocabularies(source: str, vocabs: dict[str, Vocabulary]) -> Vocabularies:
    entries = {n: (v.kind, v.size, v.max_vocab, v.mode, v.hash_seed) for n, v in vocabs.items()}
    return Vocabularies(source, {n: v.size for n, v in vocabs.items()}, entries, load=lambda: vocabs)


def grown_by(parent: Vocabulary, values: list[str], version: int) -> Vocabulary:
    b = VocabBuilder(parent.name, "str")
    b.add(np.array(values))
    return grow_vocabulary(parent, None, b, min_freq=1, version=version, expire_after=1)[0]


def test_an_evicted_value_is_accepted_only_where_its_id_is_recorded_as_reset():
    b = VocabBuilder("user", "str")
    b.add(np.array(["a", "b", "c", "d"]))
    v1 = b.finish()[0]  # a..d: ids 2..5
    v2 = grown_by(v1, ["a", "c", "e", "f", "g"], 2)  # b, d evicted; e, f take their ids 3, 5; g gets 6
    assert dict(zip(v2.keys.tolist(), v2.ids.tolist())) == {"a": 2, "c": 4, "e": 3, "f": 5, "g": 6}
    assert v2.reset.tolist() == [3, 5]
    growth = check_grown(vocabularies("checkpoint v1.pt", {"user": v1}), vocabularies("store v2", {"user": v2}), "w")
    assert [(g.name, g.old_rows, g.new_rows, g.reset.tolist()) for g in growth] == [("user", 6, 7, [3, 5])]
    same = check_grown(vocabularies("checkpoint v2.pt", {"user": v2}), vocabularies("store v2", {"user": v2}), "w")
    assert same[0].reset.tolist() == []  # a checkpoint trained on this very version: its rows are right already
    unrecorded = replace(v2, reset=None)  # the same ids without the record: 'b' is a known value with another id
    with pytest.raises(StoreError, match=r"table 'user': 2 of its 4 known values have other ids \(e.g. value 'b': "
                                         r"id 3 -> 1 \(evicted"):
        check_grown(vocabularies("checkpoint v1.pt", {"user": v1}), vocabularies("store v2", {"user": unrecorded}),
                    "w")
    v3 = grown_by(v2, ["e", "f", "g", "h"], 3)  # a, c evicted (ids 2, 4), h takes 2
    assert v3.reset.tolist() == [2, 4]
    growth = check_grown(vocabularies("c", {"user": v2}), vocabularies("s", {"user": v3}), "w")
    assert growth[0].reset.tolist() == [2, 4]
    with pytest.raises(StoreError, match=r"'b': id 3 -> 1 \(evicted"):  # v1 -> v3 skips the version that reset 3
        check_grown(vocabularies("checkpoint v1.pt", {"user": v1}), vocabularies("store v3", {"user": v3}), "w")


# ---- rows and optimizer states reset --------------------------------------------------------------------------
def collections(model) -> dict[str, EmbeddingCollection]:
    return {p: m for p, m in model.named_modules() if isinstance(m, EmbeddingCollection)}


CASES = [("deepfm", {"dnn_hidden": (16,)}, "fused", "adagrad"),
         ("din", {"dnn_hidden": (16,), "att_hidden": (8,), "mba_l2": 0.01}, "fused", "rowwise_adagrad"),
         pytest.param("deepfm", {"dnn_hidden": (16,)}, "torchrec", "adagrad", marks=TRCH),
         pytest.param("din", {"dnn_hidden": (16,), "att_hidden": (8,)}, "torchrec", "rowwise_adagrad", marks=TRCH)]


@pytest.mark.parametrize("name, params, backend, optimizer", CASES)
def test_reset_rows_and_their_optimizer_states_start_fresh(name, params, backend, optimizer, tmp_path):
    schema = behaviour_schema() if name == "din" else contract_schema()
    data = planted_data(300, seed=3, schema=schema)
    params = {**params, "embedding_backend": backend}
    cfg = TrainConfig(lr=0.05, sparse_optimizer=optimizer)

    def counts(model) -> None:  # DIN's id counts: a buffer with a row per id
        if "mba_l2" in params:
            model.get_buffer(next(k for k, _ in model.named_buffers() if k.endswith("counts_item"))).fill_(5.0)

    old, opt, ckpt = trained_checkpoint(name, schema, params, cfg, data, tmp_path / "old.pt", prepare=counts)
    reset = {"user": np.array([3, 7]), "item": np.array([2, 5, 39])}  # the tables keep their sizes (expiry)

    def build():
        torch.manual_seed(7)
        new = create_model(name, schema, **params)
        return new, build_optimizers(new, cfg)

    fresh, fresh_opt = build()
    new, new_opt = build()
    load_grown_weights(new, ckpt, params, reset=reset)
    assert load_grown_optimizer(new_opt, ckpt, table_layout(new, ckpt.weights, reset), {"sparse": True,
                                "dense": True, "wide": True})
    for prefix, m in collections(new).items():
        o, f = collections(old)[prefix], collections(fresh)[prefix]
        for t in m.tables:
            keep = np.setdiff1d(np.arange(m.tables[t].num_embeddings), reset.get(t, []))
            torch.testing.assert_close(m.table_weight(t)[keep], o.table_weight(t)[keep], rtol=0, atol=0)
            if t in reset:
                torch.testing.assert_close(m.table_weight(t)[reset[t]], f.table_weight(t)[reset[t]], rtol=0, atol=0)
                assert not torch.allclose(o.table_weight(t)[reset[t]], f.table_weight(t)[reset[t]])
        for p, starts in m.table_rows():  # the sparse optimizer's per-row state, table by table
            got = new_opt.sparse.state[p]
            old_p = next(q for q, s in o.table_rows() if s == starts)
            old_state, fresh_p = opt.sparse.state[old_p], next(q for q, s in f.table_rows() if s == starts)
            fresh_state = fresh_opt.sparse.state.get(fresh_p, {})
            for k, v in got.items():
                if not isinstance(v, torch.Tensor) or v.dim() == 0:
                    continue
                for t, at in starts.items():
                    n = m.tables[t].num_embeddings
                    rows = at + np.asarray(reset.get(t, []), np.int64)
                    keep = np.setdiff1d(np.arange(at, at + n), rows)
                    torch.testing.assert_close(v[keep], old_state[k][keep], rtol=0, atol=0)
                    want = fresh_state[k][rows] if k in fresh_state else torch.zeros_like(v[rows])
                    torch.testing.assert_close(v[rows], want, rtol=0, atol=0)
                    if len(rows):
                        assert old_state[k][rows].abs().sum() > 0  # trained: the reset changed them
    if "mba_l2" in params:
        counts = dict(new.named_buffers())[next(k for k, _ in new.named_buffers() if k.endswith("counts_item"))]
        assert counts[reset["item"]].tolist() == [0.0, 0.0, 0.0] and (np.delete(counts.numpy(), reset["item"]) == 5).all()
    kept = dict(data)  # rows whose ids are all kept (the reset ones replaced by id 10) score as with the checkpoint
    for key in ["user", "item", *(q.name for q in schema.sequence if q.shares == "item")]:
        ids = reset["user" if key == "user" else "item"]
        kept[key] = np.where(np.isin(data[key], ids), 10, data[key])
    batch = make_batch(kept, slice(200, 300), schema)
    for m in (old, new):
        m.eval()
    with torch.no_grad():
        torch.testing.assert_close(logits_of(new(batch)), logits_of(old(batch)), rtol=1e-5, atol=1e-6)
