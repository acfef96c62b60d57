"""The retrieval models (two_tower, youtube_dnn, sasrec; their contract variants in contract_cases.py):
encodings row alone = row in batch, item towers that read item features only, query towers that read what they
should, clear errors, and each loss of the RetrievalTask learning a planted next-item rule (next_item.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import behaviour_schema, contract_schema, make_batch, planted_data
from contract_cases import RETRIEVAL
from next_item import learns_next_item

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.models.base import RetrievalModel, TwoTowerModel, logits_of
from ctrkit.models.registry import ConfigError, create_model
from ctrkit.schema import Schema, SparseFeature

ITEM_KEYS = {"two_tower": ["item", "cat"], "youtube_dnn": ["item"], "sasrec": ["item"]}


@pytest.fixture(scope="module")
def data():
    return planted_data(200, seed=3, schema=behaviour_schema())


def _cases():
    return [pytest.param(n, p, id=f"{n}-{i}") for n, ps in RETRIEVAL.items() for i, p in enumerate(ps)]


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


@pytest.mark.parametrize("name", list(RETRIEVAL))
def test_item_tower_reads_only_item_features(name, data):
    """A batch of catalogue items (item features only, no user side, no dense) encodes like the full rows."""
    schema = behaviour_schema()
    model = create_model(name, schema, **RETRIEVAL[name][0]).eval()
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
    model = create_model(name, schema, **RETRIEVAL[name][0]).eval()
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


@pytest.mark.slow
@pytest.mark.parametrize("name, loss", [("two_tower", "sampled"), ("youtube_dnn", "full"), ("sasrec", "sampled")])
def test_each_loss_learns_next_item(name, loss):
    """The contract test trains every variant with the in-batch softmax; the other losses learn too."""
    before, after = learns_next_item(name, RETRIEVAL[name][0], loss)
    assert before["hr@5"] < 0.4 and after["hr@5"] > 0.9, (before, after)
