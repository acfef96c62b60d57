"""DIN, Deep Interest Network (Zhou et al., "Deep Interest Network for Click-Through Rate Prediction",
KDD 2018; seed 002 "DIN").

Idea: a user's interest in a candidate is carried by the behaviours related to it, so the history is
pooled with weights that depend on the candidate (the local activation unit) instead of a plain mean:

    e_t = [e(item_t); e(cate_t)] behaviours (B, T, Dt),  e_a = [e(item); e(cate)] the target (B, Dt)
    w_t = a(e_t, e_a) = MLP([e_a; e_t; e_a - e_t; e_a ⊙ e_t])      (unnormalised, the paper; softmax: option)
    v_U = Σ_t w_t e_t                                             (B, Dt)
    logit = MLP([others; e_a; v_U; dense])                        (Dice activations, the paper)

Training tricks of the paper, both options: Dice in the MLPs (``dnn_activation`` / ``att_activation``) and
the mini-batch-aware L2 (``mba_l2`` = λ > 0): λ Σ_{j in batch} ||w_j||² / n_j on the embedding rows present in
the batch, n_j = the id's training occurrences (counted by ``prefit``), returned as the aux loss "mba_l2".
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType

import torch
from typing_extensions import Unpack

from ctrkit.batch import Batch
from ctrkit.models._behaviour import BehaviourEmbedding, IdFrequency, behaviour_fields
from ctrkit.models._towers import DNNOptions, TowerHead, check_min, layer_options
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import register_model
from ctrkit.nn.sequence import TargetAttention
from ctrkit.schema import Schema


@register_model("din")
class DIN(CTRModel):
    """``att_hidden`` / ``att_activation`` / ``att_normalize``: the local activation unit; ``mba_l2``: the
    mini-batch-aware L2 weight λ (0: off); ``dnn_*``: the MLP over [others; target; interest; dense]."""

    needs_prefit = True  # counts the ids' training frequencies for mba_l2 (nothing to do when mba_l2 = 0)
    option_defaults = MappingProxyType({"dnn_hidden": (200, 80), "dnn_activation": "dice"})  # the paper

    def __init__(
        self,
        schema: Schema,
        *,
        att_hidden: tuple[int, ...] = (80, 40),
        att_activation: str = "dice",
        att_normalize: bool = False,
        mba_l2: float = 0.0,
        **dnn: Unpack[DNNOptions],
    ) -> None:
        super().__init__()
        check_min("din", "mba_l2", mba_l2, 0.0)
        self.fields = behaviour_fields(schema, "din")
        self.embedding = BehaviourEmbedding(schema, self.fields, self.fields.histories)
        dt = self.embedding.target_dim
        with layer_options("din", "att_hidden / att_activation"):
            self.attention = TargetAttention(dt, hidden=tuple(att_hidden), activation=att_activation,
                                             normalize=att_normalize)
        width = self.embedding.other_dim + self.embedding.target_dim + self.attention.out_features + schema.num_dense
        self.head = TowerHead(self, width, dnn)
        self.mba_l2 = float(mba_l2)
        self.frequency = IdFrequency(schema, [*self.fields.targets, *self.fields.others, *self.fields.histories])

    def prefit(self, batches: Iterable[Batch]) -> DIN:
        """Count every id's training occurrences n_j for the mini-batch-aware L2 (only when mba_l2 > 0)."""
        if self.mba_l2 > 0:
            for b in batches:
                self.frequency.count(b.sparse)
        return self

    def forward(self, batch: Batch) -> ModelOutput:
        """Logits (B,); in training with ``mba_l2`` > 0 also the aux loss "mba_l2" (a penalty on the rows the
        batch reads, so it exists only where rows are being trained)."""
        target, others = self.embedding.pooled(batch)  # (B, Dt), (B, Do)
        hist, mask = self.embedding.sequence(batch.sparse, self.fields.histories)  # (B, T, Dt), (B, T)
        interest = self.attention(target, hist, mask)  # (B, Dt)
        logits = self.head(torch.cat([others, target, interest, batch.dense], 1))  # (B,)
        aux: dict[str, torch.Tensor] = {}
        if self.training and self.mba_l2 > 0:
            aux["mba_l2"] = self.frequency.penalty(self.embedding.embedding, batch.sparse, self.mba_l2)
        return ModelOutput(logits, aux)
