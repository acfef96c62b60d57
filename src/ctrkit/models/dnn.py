"""The behaviour models' baseline: an MLP over the fields and the mean-pooled history (the "Base Model"
/ Embedding&MLP of the DIN paper, Zhou et al. KDD 2018, §4.2; seed 002 "DIN", 传统MLP结构).

    e_a = [e(item); e(cate)] the target (B, Dt),  v_U = mean_t e_t over the real behaviours (B, Dt)
    logit = MLP([others; e_a; v_U; dense])

Every behaviour counts the same whatever the candidate: the model DIN's local activation improves on.
Without a history in the schema it is a plain DNN over the pooled fields.
"""

from __future__ import annotations

import torch
from typing_extensions import Unpack

from ctrkit.batch import Batch
from ctrkit.models._behaviour import BehaviourEmbedding, behaviour_fields
from ctrkit.models._towers import DNNOptions, TowerHead
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import ConfigError, register_model
from ctrkit.nn.sequence import masked_mean
from ctrkit.schema import Schema


@register_model("dnn")
class DNN(CTRModel):
    """``dnn_*``: the MLP over [others; target; mean history; dense]."""

    def __init__(self, schema: Schema, **dnn: Unpack[DNNOptions]) -> None:
        super().__init__()
        self.fields = behaviour_fields(schema, "dnn", need_history=False)
        if not self.fields.targets and not self.fields.others:
            raise ConfigError("dnn needs at least one sparse feature in the schema")
        self.embedding = BehaviourEmbedding(schema, self.fields, self.fields.histories)
        dt = self.embedding.target_dim
        width = self.embedding.other_dim + (2 * dt if self.fields.histories else 0) + schema.num_dense  # [.; e_a; mean_t e_t]
        self.head = TowerHead(self, width, dnn)

    def forward(self, batch: Batch) -> ModelOutput:
        target, others = self.embedding.pooled(batch)  # (B, Dt), (B, Do)
        parts = [others]
        if self.fields.histories:
            hist, mask = self.embedding.sequence(batch.sparse, self.fields.histories)  # (B, T, Dt), (B, T)
            parts += [target, masked_mean(hist, mask)]  # (B, Dt) each
        return ModelOutput(self.head(torch.cat([*parts, batch.dense], 1)), {})  # (B,)
