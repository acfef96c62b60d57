"""ctrkit: CTR prediction and recommendation on PyTorch.

Shape letters used in docstrings and ``# (B, F, D)`` comments everywhere:

    B  batch size               F  number of (sparse) fields
    D  embedding dimension      T  sequence length
    N  flattened width          K  rank / number of experts
    Nd number of dense features L  number of layers

Data flow: raw file -> columnar store (:mod:`ctrkit.data.storage.store`) -> :class:`ctrkit.batch.Batch`
(dense [B, Nd] float32 + :class:`ctrkit.batch.KeyedJagged` sparse ids) -> model -> logits [B].
"""

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.schema import DenseFeature, Schema, SchemaError, SequenceFeature, SparseFeature
from ctrkit.version import __version__

__all__ = [
    "Batch",
    "DenseFeature",
    "KeyedJagged",
    "Schema",
    "SchemaError",
    "SequenceFeature",
    "SparseFeature",
    "__version__",
]
