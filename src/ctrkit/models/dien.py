"""DIEN, Deep Interest Evolution Network (Zhou et al., "Deep Interest Evolution Network for Click-Through
Rate Prediction", AAAI 2019; seed 002 "DIEN").

Idea: behaviours are a time series; a GRU extracts the interest state behind each one (supervised step by
step by an auxiliary loss), and a second, attention-gated GRU follows how the interests related to the
candidate evolve:

    e_t behaviours (B, T, Dt), e_a the target (B, Dt)
    interest extraction:  h_t = GRU(e_t, h_{t-1})                                       (B, T, H)
    auxiliary loss:       L_aux = -mean_t [log σ(s(h_t, e_{t+1})) + log(1 - σ(s(h_t, ê_{t+1})))]
                          ê: the sampled negative behaviours (role "negative", built by the data path)
    attention:            a_t = softmax_t(MLP([e_a; h_t; e_a - h_t; e_a ⊙ h_t]))          (B, T)
    interest evolution:   h'_T = AUGRU(h_t, a_t) (or AIGRU / AGRU / GRU: ``gru_type``)     (B, H)
    logit = MLP([others; e_a; h'_T; dense]),   L = BCE + α · L_aux  (α = ``aux_loss_weight``, aux loss "aux")

H = Dt (the interest lives in the behaviours' space, so the attention compares it with the target).
"""

from __future__ import annotations

import torch
from typing_extensions import Unpack

from ctrkit.batch import Batch
from ctrkit.models._behaviour import BehaviourEmbedding, behaviour_fields
from ctrkit.models._towers import DNNOptions, TowerHead, check_choice, check_min, layer_options
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import ConfigError, register_model
from ctrkit.nn.rnn import GRU_TYPES, AttentionGRU, AuxiliaryNet, dien_auxiliary_loss
from ctrkit.nn.sequence import TargetAttention
from ctrkit.schema import Schema


@register_model("dien")
class DIEN(CTRModel):
    """``gru_type``: the evolution GRU (AUGRU, the paper's best; AIGRU, AGRU, or GRU: no attention unit);
    ``aux_loss_weight`` α (0: no auxiliary loss, no negatives needed); ``aux_hidden``: the auxiliary net;
    ``att_*``: the attention unit over the interest states; ``dnn_*``: the final MLP."""

    def __init__(
        self,
        schema: Schema,
        *,
        gru_type: str = "AUGRU",
        aux_loss_weight: float = 1.0,
        aux_hidden: tuple[int, ...] = (100, 50),
        att_hidden: tuple[int, ...] = (80, 40),
        att_activation: str = "dice",
        att_normalize: bool = True,
        **dnn: Unpack[DNNOptions],
    ) -> None:
        super().__init__()
        check_choice("dien", "gru_type", gru_type, GRU_TYPES)
        check_min("dien", "aux_loss_weight", aux_loss_weight, 0.0)
        self.fields = f = behaviour_fields(schema, "dien")
        self.aux_loss_weight = float(aux_loss_weight)
        if self.aux_loss_weight > 0 and not f.negatives:
            raise ConfigError(
                f"dien: aux_loss_weight={aux_loss_weight} needs one sampled negative per history step: for each "
                f"history {f.histories}, a sequence of role 'negative' with 'of' naming it (behaviour stores have "
                f"{[f'neg_{h}' for h in f.histories]} when built with --aux-negatives), or set aux_loss_weight=0"
            )
        reads = [*f.histories, *(f.negatives if self.aux_loss_weight > 0 else [])]
        self.embedding = BehaviourEmbedding(schema, f, reads)
        dt = self.embedding.target_dim
        with layer_options("dien", "gru_type / att_hidden / att_activation / aux_hidden"):
            self.extractor = AttentionGRU(dt, dt, gru_type="GRU")
            self.attention = TargetAttention(dt, hidden=tuple(att_hidden), activation=att_activation,
                                             normalize=att_normalize) if gru_type != "GRU" else None
            self.evolution = AttentionGRU(dt, dt, gru_type=gru_type)
            aux_in = self.extractor.out_features + dt  # [h_t; e_{t+1}]
            self.aux_net = AuxiliaryNet(aux_in, hidden=tuple(aux_hidden)) if self.aux_loss_weight > 0 else None
        width = self.embedding.other_dim + dt + self.evolution.out_features + schema.num_dense
        self.head = TowerHead(self, width, dnn)

    def forward(self, batch: Batch) -> ModelOutput:
        """Logits (B,); in training with ``aux_loss_weight`` > 0 also the weighted aux loss "aux" (it needs the
        sampled negatives, which only training batches have to carry)."""
        target, others = self.embedding.pooled(batch)  # (B, Dt), (B, Do)
        hist, mask = self.embedding.sequence(batch.sparse, self.fields.histories)  # (B, T, Dt), (B, T)
        states, _ = self.extractor(hist, mask)  # (B, T, H)
        att = self.attention.scores(target, states, mask) if self.attention is not None else None  # (B, T)
        _, interest = self.evolution(states, mask, att)  # (B, H)
        logits = self.head(torch.cat([others, target, interest, batch.dense], 1))  # (B,)
        if not (self.training and self.aux_net is not None):
            return ModelOutput(logits, {})
        neg, _ = self.embedding.sequence(batch.sparse, self.fields.negatives, trim=False)  # (B, T_max, Dt)
        aux = dien_auxiliary_loss(states, hist, neg[:, : hist.shape[1]], mask, self.aux_net)
        return ModelOutput(logits, {"aux": self.aux_loss_weight * aux})
