"""jobs.scoring / jobs.predict: evaluate / predict score any model of the contract, plain logits or ModelOutput alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
import torch

from ctrkit.batch import Batch
from ctrkit.data.sources.table import preprocess_table
from ctrkit.data.storage.fitted import pipeline_from_store
from ctrkit.data.storage.store import Store
from ctrkit.jobs.predict import predict_file
from ctrkit.jobs.scoring import evaluate_store, predict_store
from ctrkit.models.base import CTRModel, ModelOutput, logits_of
from ctrkit.models.registry import create_model


class WithAux(CTRModel):
    """Another model's logits, returned as a ModelOutput with an auxiliary loss."""

    def __init__(self, inner: CTRModel) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, batch: Batch) -> ModelOutput:
        logits = logits_of(self.inner(batch))
        return ModelOutput(logits, {"aux": logits.pow(2).mean()})


def table_store(tmp_path: Path, columns: dict, spec: dict) -> tuple[Path, Store]:
    """A CSV of ``columns`` and the store ``preprocess table`` makes of it with ``spec``."""
    csv = tmp_path / "t.csv"
    pacsv.write_csv(pa.table(columns), csv)
    return csv, Store(preprocess_table(csv, spec, tmp_path / "st", split="1")["train"])


def random_model(name: str, store: Store, std: float) -> CTRModel:
    """Model ``name`` with N(0, std^2) parameters (not the zero start: scores differ from row to row)."""
    torch.manual_seed(0)
    model = create_model(name, store.schema)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    return model


def test_evaluate_and_predict_read_the_logits_of_a_model_output(tmp_path: Path):
    rng = np.random.default_rng(0)
    n = 200
    csv, store = table_store(tmp_path, {"label": rng.integers(0, 2, n), "x": rng.normal(size=n),
                                        "c": [f"v{k}" for k in rng.integers(0, 9, n)]},
                             {"label": "label", "dense": ["x"], "sparse": [{"name": "c", "embedding_dim": 4}]})
    pipe = pipeline_from_store(store)
    plain = random_model("fm", store, 0.3)
    wrapped = WithAux(plain)
    np.testing.assert_array_equal(predict_store(wrapped, store, 64, pipe), predict_store(plain, store, 64, pipe))
    assert evaluate_store(wrapped, store, pipe, 64) == evaluate_store(plain, store, pipe, 64)
    got = np.concatenate(list(predict_file(wrapped, pipe, csv, 64)))
    want = np.concatenate(list(predict_file(plain, pipe, csv, 64)))
    np.testing.assert_array_equal(got, want)
    assert len(got) == n and got.std() > 0


def test_evaluate_reports_gauc_when_the_store_has_groups(tmp_path: Path):
    from ctrkit.metrics import gauc

    rng = np.random.default_rng(1)
    n = 300
    _, store = table_store(tmp_path, {"label": rng.integers(0, 2, n), "user": [f"u{k}" for k in rng.integers(0, 12, n)],
                                      "c": [f"v{k}" for k in rng.integers(0, 9, n)]},
                           {"label": "label", "group_id": "user", "sparse": [{"name": "c", "embedding_dim": 4}]})
    pipe = pipeline_from_store(store)
    model = random_model("lr", store, 0.5)
    got = evaluate_store(model, store, pipe, 64)
    assert set(got) >= {"auc", "logloss", "accuracy", "calibration", "gauc"}
    scores = predict_store(model, store, 64, pipe)
    want, _ = gauc(scores, np.asarray(store["label"]), np.asarray(store[store.schema.group_id]))
    assert got["gauc"] == pytest.approx(want, abs=1e-9)
