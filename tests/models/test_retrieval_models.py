"""The retrieval models (two_tower, youtube_dnn, sasrec): their contract variants and schema (driven by
test_models_contract.py), encodings row alone = row in batch, item towers that read item features only, and
training through the RetrievalTask on a planted next-item rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import behaviour_schema, contract_schema, make_batch, planted_data

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.models.base import RetrievalModel, TwoTowerModel, logits_of
from ctrkit.models.registry import ConfigError, create_model
from ctrkit.retrieval.catalogue import ItemCatalogue
from ctrkit.schema import Schema, SequenceFeature, SparseFeature
from ctrkit.training.tasks import RetrievalTask

CONTRACT_VARIANTS: dict[str, list[dict]] = {
    "two_tower": [{"dnn_hidden": (16,), "out_dim": 8},
                  {"dnn_hidden": (32,), "out_dim": 16, "similarity": "dot", "temperature": 1.0, "dnn_dropout": 0.1}],
    "youtube_dnn": [{"dnn_hidden": (16,)}, {"dnn_hidden": (16, 8), "dnn_dropout": 0.1, "temperature": 0.5}],
    "sasrec": [{"num_heads": 2}, {"num_layers": 1, "att_dropout": 0.0, "ffn_dim": 16}],
}
SCHEMAS = dict.fromkeys(CONTRACT_VARIANTS, behaviour_schema)
UNPOOLED = dict.fromkeys(CONTRACT_VARIANTS, "uses")
ITEM_KEYS = {"two_tower": ["item", "cat"], "youtube_dnn": ["item"], "sasrec": ["item"]}


@pytest.fixture(scope="module")
def data():
    return planted_data(200, seed=3, schema=behaviour_schema())


def _cases():
    return [pytest.param(n, p, id=f"{n}-{i}") for n, ps in CONTRACT_VARIANTS.items() for i, p in enumerate(ps)]


@pytest.mark.parametrize("name, params", _cases())
def test_encodings_row_alone_equal_row_in_batch(name, params, data):
    schema = behaviour_schema()
    torch.manual_seed(0)
    model = create_model(name, schema, **params).eval()
    assert isinstance(model, TwoTowerModel) and isinstance(model, RetrievalModel)
    assert model.item_features == ITEM_KEYS[name] and model.item_id_feature == "item"
    batch = make_batch(data, slice(0, 48), schema)
    with torch.no_grad():
        q, v = model.encode_query(batch), model.encode_item(batch)
        assert q.shape == v.shape and q.shape[0] == 48
        torch.testing.assert_close(logits_of(model(batch)), (q * v).sum(-1) / model.temperature)
        for i in (0, 11, 47):
            one = make_batch(data, slice(i, i + 1), schema)
            torch.testing.assert_close(model.encode_query(one)[0], q[i], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(model.encode_item(one)[0], v[i], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(CONTRACT_VARIANTS))
def test_item_tower_reads_only_item_features(name, data):
    """A batch of catalogue items (item features only, no user side, no dense) encodes like the full rows."""
    schema = behaviour_schema()
    model = create_model(name, schema, **CONTRACT_VARIANTS[name][0]).eval()
    batch = make_batch(data, slice(0, 20), schema)
    ids = torch.stack([batch.sparse[k][0] for k in model.item_features], 1)  # (B, F)
    items_only = Batch(dense=torch.zeros(20, 0), sparse=KeyedJagged.from_dense(model.item_features, ids),
                       labels=torch.zeros(20))
    with torch.no_grad():
        torch.testing.assert_close(model.encode_item(items_only), model.encode_item(batch))


@pytest.mark.parametrize("name, prefix, reads", [
    ("two_tower", "hist_", True), ("two_tower", "neg_", False), ("two_tower", "sess_", False),
    ("youtube_dnn", "hist_", True), ("youtube_dnn", "sess_", False),
    ("sasrec", "hist_item", True), ("sasrec", "hist_cat", False), ("sasrec", "neg_", False),
])
def test_query_reads_what_it_should(name, prefix, reads, data):
    schema = behaviour_schema()
    model = create_model(name, schema, **CONTRACT_VARIANTS[name][0]).eval()
    other = dict(data)
    for k, v in data.items():
        if k.startswith(prefix) and not k.endswith(".lengths"):
            other[k] = (v * 7 + 3) % 10 + 2
    with torch.no_grad():
        a = model.encode_query(make_batch(data, slice(0, 32), schema))
        b = model.encode_query(make_batch(other, slice(0, 32), schema))
    assert (not torch.equal(a, b)) == reads


def test_bad_options_and_schemas():
    s = behaviour_schema()
    with pytest.raises(ConfigError, match="similarity"):
        create_model("two_tower", s, similarity="euclid")
    with pytest.raises(ConfigError, match="temperature"):
        create_model("youtube_dnn", s, temperature=0.0)
    with pytest.raises(ConfigError, match="num_heads"):
        create_model("sasrec", s, num_heads=3)
    with pytest.raises(ConfigError, match="hist_item"):
        create_model("sasrec", contract_schema())  # its history is pooled (mean): no sequence to attend over
    no_items = Schema(sparse=[SparseFeature("user", 10, 4, group="user")])
    with pytest.raises(ConfigError, match="group 'item'"):
        create_model("two_tower", no_items)


def next_item_data(n_rows: int, n_items: int = 40, seed: int = 0) -> dict[str, np.ndarray]:
    """Histories of consecutive items; the target is the item after the last one (a planted next-item rule)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 7, n_rows)
    start = rng.integers(0, n_items, n_rows)
    hist = np.concatenate([(s + np.arange(n)) % n_items for s, n in zip(start, lengths)]) + 2
    item = (start + lengths) % n_items + 2
    return {"dense": np.zeros((n_rows, 0), np.float32), "user": rng.integers(2, 30, n_rows), "item": item,
            "cat": item % 5 + 2, "hist_item": hist, "hist_item.lengths": lengths,
            "hist_cat": hist % 5 + 2, "hist_cat.lengths": lengths, "label": np.ones(n_rows, np.float32)}


def next_item_schema(n_items: int = 40) -> Schema:
    return Schema(
        sparse=[SparseFeature("user", 30, 16, group="user"), SparseFeature("item", n_items + 2, 16, group="item"),
                SparseFeature("cat", 7, 16, group="item")],
        sequence=[SequenceFeature("hist_item", 6, shares="item", pooling="none"),
                  SequenceFeature("hist_cat", 6, shares="cat", pooling="none")])


def learns_next_item(name: str, params: dict, loss: str = "in_batch") -> tuple[dict, dict]:
    """Train ``name`` through the RetrievalTask on the planted next-item rule: (metrics before, after) on held-out
    rows, full ranking over the 40 items."""
    schema, data = next_item_schema(), next_item_data(3000)
    torch.manual_seed(0)
    model = create_model(name, schema, **params)
    cat = ItemCatalogue({"item": np.arange(2, 42), "cat": np.arange(2, 42) % 5 + 2}, np.ones(40, np.int64))
    task = RetrievalTask(cat, loss=loss, num_negatives=10, sampling="frequency", metrics=["hr@1", "hr@5", "mrr"])
    task.bind(model)
    held_out = make_batch(data, slice(2500, 3000), schema)
    before = task.evaluate(model, [held_out])
    tables = {id(p) for p in model.embedding_parameters()}
    opts = [torch.optim.Adam([p for p in model.parameters() if id(p) not in tables], lr=3e-3),
            torch.optim.SparseAdam([p for p in model.parameters() if id(p) in tables], lr=1e-2)]
    rng = np.random.default_rng(0)
    model.train()
    for _ in range(12):
        perm = rng.permutation(2500)
        for s in range(0, 2500, 100):
            l, logs = task.loss(model, make_batch(data, perm[s:s + 100], schema))
            assert logs == {} and torch.isfinite(l)
            for o in opts:
                o.zero_grad()
            l.backward()
            for o in opts:
                o.step()
    return before, task.evaluate(model, [held_out])


@pytest.mark.slow
@pytest.mark.parametrize("name, loss", [("two_tower", "sampled"), ("youtube_dnn", "full"), ("sasrec", "sampled")])
def test_each_loss_learns_next_item(name, loss):
    """The contract test trains every variant with the in-batch softmax; the other losses learn too."""
    before, after = learns_next_item(name, CONTRACT_VARIANTS[name][0], loss)
    assert before["hr@5"] < 0.4 and after["hr@5"] > 0.9, (before, after)
