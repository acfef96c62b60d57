"""A planted next-item rule for the retrieval models (histories of consecutive items; the target is the item
after the last one) and a training run on it through the RetrievalTask: test_retrieval_models.py checks each
loss learns it, test_models_contract.py each retrieval variant."""

from __future__ import annotations

import numpy as np
import torch
from conftest import make_batch

from ctrkit.models.registry import create_model
from ctrkit.retrieval.catalogue import ItemCatalogue
from ctrkit.schema import Schema, SequenceFeature, SparseFeature
from ctrkit.training.optim import LazyAdam
from ctrkit.training.tasks import RetrievalTask


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
            # ctrkit's sparse_adam: torch's SparseAdam refuses the dense gradients of small tables
            LazyAdam([p for p in model.parameters() if id(p) in tables], lr=1e-2)]
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
