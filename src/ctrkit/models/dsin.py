"""DSIN, Deep Session Interest Network (Feng et al., "Deep Session Interest Network for Click-Through Rate
Prediction", IJCAI 2019; seed 002 "DSIN").

Idea: behaviours come in sessions (split where the gap is >= 30 minutes by the data path); behaviours in a
session are alike, sessions differ. Self-attention inside each session gives one interest per session, a
Bi-LSTM over the sessions follows how they evolve, and two candidate-aware activations pool both:

    Q = sessions (B, K, T, Dt) + BE,  BE_(k,t,c) = w^K_k + w^T_t + w^C_c        (bias encoding)
    I_k = avg_t TransformerLayer(Q_k)           one layer shared by the K sessions   (B, K, Dt)
    H_k = BiLSTM(I)_k                           merge_mode of the seed               (B, K, H')
    u_I = Σ_k softmax_k(I_k W^I e_a) I_k,  u_H = Σ_k softmax_k(H_k W^H e_a) H_k   (empty sessions masked)
    logit = MLP([others; e_a; u_I; u_H; dense])

Sessions are the sequences the schema declares with role "session" and number k (k = 0 the oldest kept;
a behaviour store's ``sess_<k>_<attr>``); empty sessions are padding.
"""

from __future__ import annotations

import torch
from typing_extensions import Unpack

from ctrkit.batch import Batch
from ctrkit.models._behaviour import BehaviourEmbedding, behaviour_fields
from ctrkit.models._towers import DNNOptions, TowerHead, check_min, layer_options
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import ConfigError, register_model
from ctrkit.nn.session import BiasEncoding, BiLSTM, SessionActivation, SessionInterestExtractor
from ctrkit.schema import Schema


@register_model("dsin")
class DSIN(CTRModel):
    """``num_heads`` / ``ffn_dim`` / ``att_dropout``: the per-session transformer layer; ``lstm_layers`` /
    ``lstm_res_layers`` / ``merge_mode``: the Bi-LSTM over sessions (seed 002's BiLSTM); ``dnn_*``: the MLP."""

    def __init__(
        self,
        schema: Schema,
        *,
        num_heads: int = 2,
        ffn_dim: int | None = None,
        att_dropout: float = 0.0,
        lstm_layers: int = 1,
        lstm_res_layers: int = 0,
        merge_mode: str = "ave",
        **dnn: Unpack[DNNOptions],
    ) -> None:
        super().__init__()
        check_min("dsin", "num_heads", num_heads, 1)
        self.fields = f = behaviour_fields(schema, "dsin", need_history=False)
        if not f.sessions:
            unpooled = [(q.name, q.role) for q in schema.sequence if q.pooling == "none"]
            raise ConfigError(
                "dsin needs session sequences: unpooled sequences of role 'session' with their number 'session' "
                "(0 = the oldest), one per behaviour attribute (e.g. a behaviour store's sess_0_item, sess_0_cate, "
                f"...); the schema's unpooled sequences (name, role) are {unpooled or 'none'}. Behaviour stores "
                "built with --sessions S (needs timestamps) have them"
            )
        self.embedding = BehaviourEmbedding(schema, f, [k for s in f.sessions for k in s])
        dt = self.embedding.target_dim
        k, t = len(f.sessions), f.session_len
        with layer_options("dsin", "num_heads / ffn_dim / lstm_layers / lstm_res_layers / merge_mode"):
            self.bias = BiasEncoding(k, t, dt)
            self.extractor = SessionInterestExtractor(dt, num_heads=num_heads, ffn_dim=ffn_dim, dropout=att_dropout)
            self.bilstm = BiLSTM(dt, dt, layers=lstm_layers, res_layers=lstm_res_layers, merge_mode=merge_mode)
            self.act_interest = SessionActivation(dt, dt)
            self.act_evolution = SessionActivation(dt, self.bilstm.out_features)
        width = (self.embedding.other_dim + dt + self.act_interest.out_features + self.act_evolution.out_features
                 + schema.num_dense)
        self.head = TowerHead(self, width, dnn)

    def forward(self, batch: Batch) -> ModelOutput:
        target, others = self.embedding.pooled(batch)  # (B, Dt), (B, Do)
        parts = [self.embedding.sequence(batch.sparse, s, trim=False) for s in self.fields.sessions]
        q = torch.stack([e for e, _ in parts], 1)  # (B, K, T, Dt)
        mask = torch.stack([m for _, m in parts], 1)  # (B, K, T)
        interests = self.extractor(self.bias(q), mask)  # (B, K, Dt)
        smask = mask.any(-1)  # (B, K): sessions with a behaviour
        evolved = self.bilstm(interests, smask)  # (B, K, H')
        u_i = self.act_interest(target, interests, smask)  # (B, Dt)
        u_h = self.act_evolution(target, evolved, smask)  # (B, H')
        return ModelOutput(self.head(torch.cat([others, target, u_i, u_h, batch.dense], 1)), {})  # (B,)
