"""ctrkit: CTR prediction and recommendation on PyTorch.

Shape letters used in docstrings and ``# (B, F, D)`` comments everywhere:

    B  batch size               F  number of (sparse) fields
    D  embedding dimension      T  sequence length
    N  flattened width          K  rank / number of experts
    Nd number of dense features L  number of layers

Data flow: raw file -> columnar store (:mod:`ctrkit.data.storage.store`) -> :class:`ctrkit.batch.Batch`
(dense [B, Nd] float32 + :class:`ctrkit.batch.KeyedJagged` sparse ids) -> model -> logits [B].
"""

import importlib
from typing import Any

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.errors import (
    CheckpointError,
    ConfigError,
    CtrkitError,
    DataError,
    JobError,
    RowErrors,
    SchemaError,
    StoreError,
    TrainingError,
)
from ctrkit.schema import DenseFeature, Schema, SequenceFeature, SparseFeature
from ctrkit.version import __version__

# The verbs import the jobs, models and serving on first use, so every CLI start does not load them all.
_LAZY = {
    "preprocess_criteo": "ctrkit.data.sources.criteo",
    "preprocess_table": "ctrkit.data.sources.table",
    "preprocess_behaviour": "ctrkit.data.sources.behaviour",
    "load_config": "ctrkit.training.config",
    "train": "ctrkit.api",
    "evaluate": "ctrkit.api",
    "Predictor": "ctrkit.serving.predictor",
    "create_model": "ctrkit.models",
    "list_models": "ctrkit.models",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ctrkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "Batch", "CheckpointError", "ConfigError", "CtrkitError", "DataError", "DenseFeature", "JobError",
    "KeyedJagged", "Predictor", "RowErrors", "Schema", "SchemaError", "SequenceFeature", "SparseFeature",
    "StoreError", "TrainingError", "__version__", "create_model", "evaluate", "list_models", "load_config",
    "preprocess_behaviour", "preprocess_criteo", "preprocess_table", "train",
]
