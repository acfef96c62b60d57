"""Warm start (training/warm_start.py, data/storage/lineage.py): optimizer states kept through the growth of the
tables (the next step on known ids is the step the checkpoint's run would have taken), for every sparse optimizer
and both backends; refusals name the model, feature or table at fault; the vocabulary parent check."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import behaviour_schema, contract_schema, make_batch, planted_data
from warm_cases import TRCH, step, trained_checkpoint

from ctrkit.checkpoint import Checkpoint
from ctrkit.data.pipeline.vocab import Vocabulary
from ctrkit.data.pipeline.vocab_arrays import with_keys
from ctrkit.data.storage.agree import Vocabularies
from ctrkit.data.storage.lineage import check_grown
from ctrkit.errors import CheckpointError, StoreError
from ctrkit.models.base import logits_of
from ctrkit.models.registry import create_model
from ctrkit.nn.embedding_interface import EmbeddingCollection
from ctrkit.schema import DenseFeature, Schema
from ctrkit.training.config import TrainConfig
from ctrkit.training.optim import build_optimizers
from ctrkit.training.warm_start import (
    check_warm_start,
    load_grown_optimizer,
    load_grown_weights,
    table_layout,
)


def grown(schema: Schema) -> Schema:
    return replace(schema, sparse=[replace(f, vocab_size=f.vocab_size + 3 + i) for i, f in enumerate(schema.sparse)])


def tables(model) -> dict[str, torch.Tensor]:
    return {f"{p}.{t}": m.table_weight(t).detach().clone() for p, m in model.named_modules()
            if isinstance(m, EmbeddingCollection) for t in m.tables}


CASES = [("deepfm", {"dnn_hidden": (16,)}, "fused", "adagrad"),
         ("deepfm", {"dnn_hidden": (16,)}, "fused", "rowwise_adagrad"),
         ("deepfm", {"dnn_hidden": (16,)}, "fused", "sparse_adam"),
         ("din", {"dnn_hidden": (16,), "att_hidden": (8,)}, "fused", "adagrad"),  # unpooled histories
         ("wide_deep", {"dnn_hidden": (16,)}, "fused", "ftrl"),  # the wide part's FTRL state
         pytest.param("deepfm", {"dnn_hidden": (16,)}, "torchrec", "adagrad", marks=TRCH),
         pytest.param("din", {"dnn_hidden": (16,), "att_hidden": (8,)}, "torchrec", "rowwise_adagrad", marks=TRCH)]


@pytest.mark.parametrize("name, params, backend, optimizer", CASES)
def test_the_next_step_on_known_ids_is_the_checkpoints_run_next_step(name, params, backend, optimizer, tmp_path):
    schema = behaviour_schema() if name == "din" else contract_schema()
    data = planted_data(400, seed=3, schema=schema)
    params = {**params, "embedding_backend": backend}
    cfg = TrainConfig(lr=0.02, sparse_optimizer="adagrad" if optimizer == "ftrl" else optimizer,
                      wide_optimizer="ftrl" if optimizer == "ftrl" else "default")
    old, opt, ckpt = trained_checkpoint(name, schema, params, cfg, data, tmp_path / "old.pt")

    def warm(with_state: bool):
        torch.manual_seed(7)
        new = create_model(name, grown(schema), **params)
        load_grown_weights(new, ckpt, params)
        new_opt = build_optimizers(new, cfg)
        if with_state:
            loaded = load_grown_optimizer(new_opt, ckpt, table_layout(new, ckpt.weights), dict.fromkeys(
                ("dense", "sparse", "wide"), True))
            assert loaded == [p for p in ("dense", "sparse", "wide") if getattr(new_opt, p) is not None]
        return new, new_opt

    new, new_opt = warm(True)
    cold, cold_opt = warm(False)  # the control: fresh optimizer states take another step
    batch = make_batch(data, slice(200, 264), schema)
    for m, o in ((old, opt), (new, new_opt), (cold, cold_opt)):
        step(m, o, batch)
    before, after, control = tables(old), tables(new), tables(cold)
    for key, w in before.items():
        torch.testing.assert_close(after[key][: w.shape[0]], w, rtol=1e-6, atol=1e-7, msg=key)
    assert any(not torch.allclose(control[k][: w.shape[0]], w, rtol=1e-4, atol=1e-6) for k, w in before.items())
    for m in (old, new):
        m.eval()
    with torch.no_grad():
        torch.testing.assert_close(logits_of(new(batch)), logits_of(old(batch)), rtol=1e-5, atol=1e-6)


def test_a_checkpoint_of_another_model_or_schema_is_refused():
    schema = contract_schema()
    torch.manual_seed(0)
    ckpt = Checkpoint.of(create_model("deepfm", schema), schema=schema, model_params={})
    ckpt.source = "runs/a/best.pt"
    with pytest.raises(CheckpointError, match=r"runs/a/best.pt is a checkpoint of model 'deepfm'.*trains 'dcn'"):
        check_warm_start(ckpt, "dcn", grown(schema), "--warm-start")
    check_warm_start(ckpt, "deepfm", grown(schema), "--warm-start")  # grown vocabularies only: accepted
    added = replace(schema, dense=[*schema.dense, DenseFeature("d3")])
    with pytest.raises(CheckpointError, match="dense features added: d3"):
        check_warm_start(ckpt, "deepfm", added, "--warm-start")
    multi = replace(schema, sparse=[replace(f, multi_valued=True) if f.name == "cat" else f for f in schema.sparse])
    with pytest.raises(CheckpointError, match="sparse feature 'cat': multi_valued False -> True"):
        check_warm_start(ckpt, "deepfm", multi, "--warm-start")
    shrunk = replace(schema, sparse=[replace(f, vocab_size=30) if f.name == "user" else f for f in schema.sparse])
    with pytest.raises(CheckpointError, match="table 'user' shrank from 50 to 30 rows"):
        check_warm_start(ckpt, "deepfm", shrunk, "--warm-start")
    with pytest.raises(CheckpointError, match=r"table 'user'.*50 rows, more than the 30 of the new vocabulary"):
        load_grown_weights(create_model("deepfm", shrunk), ckpt, {})
    with pytest.raises(CheckpointError, match=r"model.params differ: dnn_hidden"):
        load_grown_weights(create_model("deepfm", grown(schema), dnn_hidden=(7,)), ckpt, {"dnn_hidden": (7,)})


# ---- the vocabulary parent check ------------------------------------------------------------------------------
def vocabularies(source: str, vocabs: dict[str, Vocabulary]) -> Vocabularies:
    entries = {n: (v.kind, v.size, v.max_vocab, v.mode, v.hash_seed) for n, v in vocabs.items()}
    return Vocabularies(source, {n: v.size for n, v in vocabs.items()}, entries, load=lambda: vocabs)


def fitted(name: str, keys, kind: str = "str", **options) -> Vocabulary:
    keys = np.asarray(keys)
    return Vocabulary.build(name, kind, keys, np.ones(len(keys), np.int64), **options)


def test_a_grown_vocabulary_is_a_child_and_a_renumbered_or_shrunk_one_is_not():
    parent = {"user": fitted("user", ["a", "b", "c"]), "city": fitted("city", [10, 20], "int"),
              "item": fitted("item", ["x", "y"], max_vocab=50)}  # hashed: a fixed size
    child = {"user": with_keys(parent["user"], np.array(["d", "a", "e"])), "city": with_keys(parent["city"], [30]),
             "item": fitted("item", ["x", "z", "w"], max_vocab=50)}
    growth = check_grown(vocabularies("checkpoint c.pt", parent), vocabularies("store new", child), "--warm-start")
    assert {(g.name, g.old_rows, g.new_rows) for g in growth} == {("user", 5, 7), ("city", 4, 5), ("item", 50, 50)}
    renumbered = {**child, "user": fitted("user", ["b", "a", "c", "d"])}  # 'a' and 'b' swapped ids
    with pytest.raises(StoreError, match=r"table 'user': 2 of its 3 known values have other ids \(e.g. value 'a': "
                                         r"id 2 -> 3\).*--vocab-from .* --grow"):
        check_grown(vocabularies("checkpoint c.pt", parent), vocabularies("store new", renumbered), "--warm-start")
    shrunk = {**child, "city": fitted("city", [10], "int")}
    with pytest.raises(StoreError, match="table 'city': it shrank from 4 to 3 ids"):
        check_grown(vocabularies("checkpoint c.pt", parent), vocabularies("store new", shrunk), "--warm-start")
    rehashed = {**child, "item": fitted("item", ["x"], max_vocab=60)}
    with pytest.raises(StoreError, match=r"table 'item': its ids come from another rule \(max_vocab 50 -> 60\)"):
        check_grown(vocabularies("checkpoint c.pt", parent), vocabularies("store new", rehashed), "--warm-start")
    ids_only = Vocabularies("store ids", {"user": 7, "city": 5, "item": 50})
    with pytest.raises(StoreError, match="only the checkpoint has vocabularies"):
        check_grown(vocabularies("checkpoint c.pt", parent), ids_only, "--warm-start")
    assert [g.new_rows for g in check_grown(Vocabularies("checkpoint", {"t": 5}), Vocabularies("store", {"t": 9}),
                                            "--warm-start")] == [9]
    with pytest.raises(StoreError, match="table 't': it shrank from 5 to 4 rows"):
        check_grown(Vocabularies("checkpoint", {"t": 5}), Vocabularies("store", {"t": 4}), "--warm-start")
