"""RetrievalTask: its losses are the loss functions on the model's towers; rows whose item is not in the catalogue
(the rare id 1) are left out; bad options fail at construction."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import behaviour_schema, make_batch, planted_data

from ctrkit.errors import ConfigError, MetricError
from ctrkit.models.registry import create_model
from ctrkit.retrieval.catalogue import ItemCatalogue
from ctrkit.retrieval.losses import full_softmax_loss, in_batch_softmax_loss
from ctrkit.training.tasks import RetrievalTask


def setup():
    schema = behaviour_schema()
    data = planted_data(64, seed=7, schema=schema)
    torch.manual_seed(0)
    model = create_model("two_tower", schema, dnn_hidden=(16,), out_dim=8).eval()
    ids = np.arange(2, 40)
    cat = ItemCatalogue({"item": ids, "cat": ids % 10 + 2}, (ids % 3 + 1).astype(np.int64))
    return schema, data, model, cat


@pytest.mark.parametrize("loss", ["in_batch", "full"])
def test_loss_is_the_loss_function_on_the_towers_without_rare_rows(loss):
    schema, data, model, cat = setup()
    data = dict(data)
    data["item"] = data["item"].copy()
    data["item"][[3, 10]] = 1  # rare / unseen items: no catalogue row
    batch = make_batch(data, slice(0, 32), schema)
    task = RetrievalTask(cat, loss=loss).bind(model)
    got, logs = task.loss(model, batch)
    keep = torch.ones(32, dtype=torch.bool)
    keep[[3, 10]] = False
    q, v = model.encode_query(batch)[keep], model.encode_item(batch)[keep]
    rows = cat.rows_of(batch.sparse["item"][0])[keep]
    if loss == "in_batch":
        share = torch.as_tensor(cat.counts / cat.counts.sum())
        want = in_batch_softmax_loss(q, v, rows, temperature=model.temperature, log_q=share.log()[rows])
    else:
        want = full_softmax_loss(q, model.encode_item(cat.batch()), rows, temperature=model.temperature)
    torch.testing.assert_close(got, want)
    assert logs == {}


def test_bad_options():
    _, _, model, cat = setup()
    with pytest.raises(ConfigError, match="loss"):
        RetrievalTask(cat, loss="bpr")
    with pytest.raises(ConfigError, match="num_negatives"):
        RetrievalTask(cat, num_negatives=0)
    with pytest.raises(MetricError, match="hr@K"):
        RetrievalTask(cat, metrics=["auc"])
    with pytest.raises(ConfigError, match="retrieval model"):
        RetrievalTask(cat).bind(create_model("din", behaviour_schema()))
    with pytest.raises(ConfigError, match="lacks the item features"):
        RetrievalTask(ItemCatalogue({"item": np.arange(2, 5)}, np.ones(3, np.int64))).bind(model)
