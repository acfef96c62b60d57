"""Per-position training on sequence rows (SASRec, Kang & McAuley's protocol): the loss of one row per user
sequence equals a naive loop over its prefixes (each a per-prefix row scored by ``encode_query``), padding never
contributes, and models / positions that cannot train per position are refused with the fix."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_batch

from ctrkit.errors import ConfigError
from ctrkit.models.registry import create_model
from ctrkit.retrieval.batching import batch_rows, length_groups
from ctrkit.retrieval.catalogue import ItemCatalogue, position_targets
from ctrkit.retrieval.losses import full_softmax_loss
from ctrkit.schema import Schema, SequenceFeature, SparseFeature
from ctrkit.training.tasks import RetrievalTask

N_ITEMS = 40


def next_item_schema(n_items: int) -> Schema:
    return Schema(
        sparse=[SparseFeature("user", 30, 16, group="user"), SparseFeature("item", n_items + 2, 16, group="item"),
                SparseFeature("cat", 7, 16, group="item")],
        sequence=[SequenceFeature("hist_item", 6, shares="item", pooling="none"),
                  SequenceFeature("hist_cat", 6, shares="cat", pooling="none")])


def catalogue() -> ItemCatalogue:
    ids = np.arange(2, N_ITEMS + 2)
    return ItemCatalogue({"item": ids, "cat": ids % 5 + 2}, (ids % 4 + 1).astype(np.int64))


def sequence_rows(lengths: list[int], seed: int = 0) -> dict[str, np.ndarray]:
    """Rows of random histories (item ids 2..41) and a last target each, as sequence rows are stored."""
    rng = np.random.default_rng(seed)
    ln = np.asarray(lengths)
    hist = rng.integers(2, N_ITEMS + 2, int(ln.sum()))
    item = rng.integers(2, N_ITEMS + 2, len(ln))
    return {"dense": np.zeros((len(ln), 0), np.float32), "user": np.arange(len(ln)) + 2, "item": item,
            "cat": item % 5 + 2, "hist_item": hist, "hist_item.lengths": ln, "hist_cat": hist % 5 + 2,
            "hist_cat.lengths": ln, "label": np.ones(len(ln), np.float32)}


def prefix_rows(seq: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The naive per-prefix rows of sequence rows: for step t of row b, the history cut after t and the item after
    it (the next step, or the row's item after the last step), in row-major order."""
    cols: dict[str, list] = {"user": [], "item": [], "hist": [], "len": []}
    off = np.concatenate([[0], np.cumsum(seq["hist_item.lengths"])])
    for b in range(len(seq["label"])):
        h = seq["hist_item"][off[b]:off[b + 1]]
        for t in range(len(h)):
            cols["user"].append(seq["user"][b])
            cols["item"].append(h[t + 1] if t + 1 < len(h) else seq["item"][b])
            cols["hist"].append(h[:t + 1])
            cols["len"].append(t + 1)
    hist, item, n = np.concatenate(cols["hist"]), np.asarray(cols["item"]), len(cols["item"])
    ln = np.asarray(cols["len"])
    return {"dense": np.zeros((n, 0), np.float32), "user": np.asarray(cols["user"]), "item": item,
            "cat": item % 5 + 2, "hist_item": hist, "hist_item.lengths": ln, "hist_cat": hist % 5 + 2,
            "hist_cat.lengths": ln, "label": np.ones(n, np.float32)}


def sasrec(**params):
    torch.manual_seed(0)
    return create_model("sasrec", next_item_schema(N_ITEMS), num_layers=2, num_heads=2, att_dropout=0.0,
                        positions="absolute", **params)


def test_position_targets_shift_the_history_and_end_with_the_item():
    data = sequence_rows([3, 1, 2])
    kj = make_batch(data, slice(None), next_item_schema(N_ITEMS)).sparse
    h, item = data["hist_item"], data["item"]
    want = torch.tensor([[h[1], h[2], item[0], 0], [item[1], 0, 0, 0], [h[5], item[2], 0, 0]])
    torch.testing.assert_close(position_targets(kj, "hist_item", "item", 4), want)


def test_every_position_is_the_query_of_its_prefix():
    """H[t] of a sequence row = encode_query of the row cut after step t (the causal mask: t sees steps <= t)."""
    schema, model = next_item_schema(N_ITEMS), sasrec().eval()
    seq = sequence_rows([6, 3, 1, 5])
    h, mask = model.encode_positions(make_batch(seq, slice(None), schema))  # (B, T, D), (B, T)
    naive = model.encode_query(make_batch(prefix_rows(seq), slice(None), schema))  # (n, D)
    assert int(mask.sum()) == len(naive) == 15
    torch.testing.assert_close(h[mask], naive, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("loss", ["full", "in_batch"])
def test_per_position_loss_equals_a_naive_loop_over_prefixes(loss):
    schema, model, cat = next_item_schema(N_ITEMS), sasrec().train(), catalogue()
    seq = sequence_rows([6, 3, 1, 5, 6], seed=1)
    got, _ = RetrievalTask(cat, loss=loss, per_position=True).bind(model).loss(model, make_batch(
        seq, slice(None), schema))
    naive_task = RetrievalTask(cat, loss=loss).bind(model)
    pre = prefix_rows(seq)
    if loss == "full":  # the mean over prefixes of each prefix's own loss, one row at a time
        per_row = [naive_task.loss(model, make_batch(pre, [i], schema))[0] for i in range(len(pre["item"]))]
        want = torch.stack(per_row).mean()
    else:  # in-batch negatives: the batch of all the prefixes
        want = naive_task.loss(model, make_batch(pre, slice(None), schema))[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    got.backward()  # gradients reach the item table, positions and blocks
    assert model.position.grad is not None and model.position.grad[:6].abs().sum() > 0


def test_overlapping_windows_train_each_target_on_the_row_that_owns_it():
    """window (max_len 6, stride 2): a full row owns its last 2 positions, a shorter row all of its positions."""
    schema, model, cat = next_item_schema(N_ITEMS), sasrec().train(), catalogue()
    seq = sequence_rows([6, 3], seed=4)
    got, _ = RetrievalTask(cat, loss="full", per_position=True, window=(6, 2)).bind(model).loss(
        model, make_batch(seq, slice(None), schema))
    pre = prefix_rows(seq)  # row-major: the full row's positions 0..5, then the short row's 0..2
    task = RetrievalTask(cat, loss="full").bind(model)
    want = torch.stack([task.loss(model, make_batch(pre, [i], schema))[0] for i in (4, 5, 6, 7, 8)]).mean()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("targets", ["owned", "all"])
def test_sequence_targets_option_picks_the_positions_with_loss(targets):
    """train.retrieval.sequence_targets: "owned" trains each target on the row that owns it (as above), "all" on every
    real position of every window (a target of overlapping windows once per window), through the job's task."""
    from ctrkit.jobs.tasks import RetrievalKind
    from ctrkit.training.config import config_from_dict

    schema, model, cat = next_item_schema(N_ITEMS), sasrec().train(), catalogue()
    seq = sequence_rows([6, 3], seed=4)
    cfg = config_from_dict({"model": {"name": "sasrec"}, "data": {"train": "t"},
                            "train": {"retrieval": {"loss": "full", "sequence_targets": targets}}})
    task = RetrievalKind.task(RetrievalKind().configure(cfg), cat, None, window=(6, 2)).bind(model)
    got, _ = task.loss(model, make_batch(seq, slice(None), schema))
    pre = prefix_rows(seq)  # row-major: the full row's positions 0..5, then the short row's 0..2
    naive = RetrievalTask(cat, loss="full").bind(model)
    rows = (4, 5, 6, 7, 8) if targets == "owned" else range(9)
    want = torch.stack([naive.loss(model, make_batch(pre, [i], schema))[0] for i in rows]).mean()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_padding_never_contributes():
    """A row's loss alone = its part of a batch padded to a longer row; pads get no gradient (positions past the
    longest row, the pad id's embedding row)."""
    schema, model, cat = next_item_schema(N_ITEMS), sasrec().train(), catalogue()
    task = RetrievalTask(cat, loss="full", per_position=True).bind(model)
    seq = sequence_rows([2, 5], seed=2)
    alone = [task.loss(model, make_batch(seq, [b], schema))[0] for b in (0, 1)]
    both, _ = task.loss(model, make_batch(seq, slice(None), schema))
    torch.testing.assert_close(both, (2 * alone[0] + 5 * alone[1]) / 7, rtol=1e-5, atol=1e-6)
    model.zero_grad()
    task.loss(model, make_batch(seq, slice(None), schema))[0].backward()
    assert model.position.grad[5:].abs().sum() == 0  # max_len 6, longest row 5
    (table,) = model.embedding_parameters()  # every table of dim 16, fused: item's rows start at its offset
    g = table.grad.to_dense() if table.grad.is_sparse else table.grad
    assert g[model.embedding.embedding.row_offset["item"]].abs().sum() == 0  # the pad id 0


def test_rare_targets_are_left_out():
    schema, model, cat = next_item_schema(N_ITEMS), sasrec().eval(), catalogue()
    seq = sequence_rows([4], seed=3)
    seq["hist_item"] = seq["hist_item"].copy()
    seq["hist_item"][2] = 1  # the target of step 1 is rare: no catalogue row
    got, _ = RetrievalTask(cat, loss="full", per_position=True).bind(model).loss(model, make_batch(seq, [0], schema))
    h, _ = model.encode_positions(make_batch(seq, [0], schema))
    rows = cat.rows_of(torch.as_tensor([seq["hist_item"][1], seq["hist_item"][3], seq["item"][0]]))
    want = full_softmax_loss(h[0, [0, 2, 3]], model.encode_item(cat.batch()), rows)
    torch.testing.assert_close(got, want)


def test_models_that_cannot_train_per_position_are_refused():
    schema, cat = next_item_schema(N_ITEMS), catalogue()
    with pytest.raises(ConfigError, match="positions=absolute"):
        RetrievalTask(cat, per_position=True).bind(create_model("sasrec", schema))
    with pytest.raises(ConfigError, match="--train-rows prefix"):
        RetrievalTask(cat, per_position=True).bind(create_model("two_tower", schema))
    with pytest.raises(ConfigError, match="positions"):
        create_model("sasrec", schema, positions="relative")
    RetrievalTask(cat).bind(sasrec())  # absolute positions train on per-prefix rows too


def test_batch_rows_and_length_groups():
    schema = next_item_schema(N_ITEMS)
    seq = sequence_rows([6, 1, 3, 0, 2, 5], seed=5)
    batch = make_batch(seq, slice(None), schema)
    groups = length_groups(batch.sparse["hist_item"][1])
    assert [g.tolist() for g in groups] == [[0, 5], [2], [4], [1, 3]]  # ceil(log2 len): 3, 2, 1, 0
    rows = torch.tensor([5, 2, 0])
    sub, want = batch_rows(batch, rows), make_batch(seq, [5, 2, 0], schema)
    for k in schema.sparse_keys:
        for a, b in zip(sub.sparse[k], want.sparse[k]):
            torch.testing.assert_close(a, b)
    torch.testing.assert_close(sub.labels, want.labels)
