"""Product-based Neural Network (Qu et al., "Product-based Neural Networks for User Response
Prediction", ICDM 2016; seed 002 "PNN").

Idea: a product layer feeds the DNN both the field embeddings (linear signals z) and their pairwise
products (p), inner (IPNN), sum-pooled outer (OPNN) or both (PNN*):

    l_1 = ReLU(l_z + l_p + b)                       (B, units)   :class:`PNNProductLayer`
    h   = MLP([l_1 ; x_dense])                      dense features join after the product layer (seed)
    logit = w^T h + b_out                           (B,)
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Literal

import torch
from typing_extensions import Unpack

from ctrkit.batch import Batch
from ctrkit.models._towers import DNNOptions, TowerHead
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import ConfigError, register_model
from ctrkit.nn.inputs import ZOO_INIT_STD, FieldEmbedding
from ctrkit.nn.product import PNNProductLayer
from ctrkit.schema import Schema

PRODUCTS = ("inner", "outer", "both")


@register_model("pnn")
class PNN(CTRModel):
    """``product``: inner | outer | both; ``product_units``: width of l_1; ``dnn_hidden`` /
    ``dnn_activation`` / ``dnn_dropout`` / ``dnn_batch_norm``: the MLP on ``[l_1 ; dense]``. Needs one
    embedding dim D and at least 2 sparse fields."""

    option_defaults = MappingProxyType({"dnn_hidden": (128, 64)})

    def __init__(
        self,
        schema: Schema,
        *,
        embedding_init_std: float | None = ZOO_INIT_STD,
        product: Literal["inner", "outer", "both"] = "inner",
        product_units: int = 64,
        **dnn: Unpack[DNNOptions],
    ) -> None:
        super().__init__()
        if product not in PRODUCTS:
            raise ConfigError(f"pnn: product {product!r} is not one of {PRODUCTS}")
        if product_units < 1:
            raise ConfigError(f"pnn: product_units must be >= 1, got {product_units}")
        self.embedding = FieldEmbedding(schema, model="pnn", init_std=embedding_init_std)
        F, D = self.embedding.num_fields, self.embedding.embedding_dim
        if F < 2:
            raise ConfigError(f"pnn needs at least 2 sparse fields for its products; the schema has {F}")
        self.product = PNNProductLayer(F, D, product_units, mode=product)
        self.deep = TowerHead(self, product_units + schema.num_dense, dnn)  # (B, units + Nd) -> (B,)

    def forward(self, batch: Batch) -> ModelOutput:
        l1 = torch.relu(self.product(self.embedding(batch)))  # (B, F, D) -> (B, units)
        return ModelOutput(self.deep(torch.cat([l1, batch.dense], dim=1)), {})  # (B, units + Nd) -> (B,)
