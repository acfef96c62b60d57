"""LS-PLM / MLR, mixed logistic regression (Gai et al., "Learning Piece-wise Linear Models from
Large Scale Data for Ad Click Prediction", 2017; seed 002 "LS-PLM").

Idea: split the feature space into m regions with a softmax gate and fit one LR per region:

    p(y=1|x) = Σ_{i=1..m} π_i(x) σ(w_i·x),      π(x) = softmax(u_1·x, ..., u_m·x)

m = 12 by default (Alibaba's choice in the seed). x is the one-hot sparse ids plus the dense
values, so ``u_i·x = Σ_f u_i[id_f] + <u_i^d, x_dense> + c_i`` (likewise w_i): every schema table is
re-created with width 2m holding (u_1..u_m, w_1..w_m) per id, and all fields' rows are summed.

The model outputs a probability mixture, so ``forward`` returns its logit, computed stably in log
space (Σ π_i = 1, σ(−z) = 1 − σ(z)):

    log p     = logsumexp_i( log π_i + log σ(z_i) )
    log (1−p) = logsumexp_i( log π_i + log σ(−z_i) )
    logit     = log p − log (1−p)

Regularisation (the paper uses L1 + L2,1 norms): the model declares one parameter group,
"regions", whose penalty the task adds to the loss (logged as ``penalty/regions``):

    l1 · Σ|W| + l2 · Σ W² + l21 · Σ_rows ‖W_row‖₂

over all region weights W (the 2m-wide id rows and the dense weights; not the biases), where
a "row" is one feature's 2m parameters (the paper's group lasso per feature). The penalty walks
whole tables every step; for very large tables prefer the trainer's mini-batch-aware
``embedding_l2`` (touched rows only) and leave these at 0 (the default: no penalty).
Gradient-based L1 shrinks weights but does not make them exactly zero (the paper's OWLQN does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ctrkit.batch import Batch
from ctrkit.models.base import CTRModel, ModelOutput, ParamGroup
from ctrkit.models.registry import ConfigError, register_model
from ctrkit.nn.embedding_factory import make_embeddings
from ctrkit.schema import Schema


@register_model("mlr")
class MLR(CTRModel):
    """``regions``: m; ``l1`` / ``l2`` / ``l21``: penalty weights of the "regions" group (:meth:`param_groups`);
    ``init_std``: the region weights (id rows and dense weights) start N(0, init_std²) when given (DeepCTR's
    MLR: 1e-4, so every region starts at logit ~0 and gate ~1/m whatever the seed), else the tables start
    U(±√(1/rows)) (torchrec's default) and the dense weight at nn.Linear's default."""

    def __init__(
        self, schema: Schema, *, regions: int = 12, l1: float = 0.0, l2: float = 0.0, l21: float = 0.0,
        init_std: float | None = None,
    ) -> None:
        super().__init__()
        if regions < 1:
            raise ConfigError(f"mlr: regions must be >= 1, got {regions}")
        for name, value in (("l1", l1), ("l2", l2), ("l21", l21)):
            if value < 0:
                raise ConfigError(f"mlr: {name} must be >= 0, got {value}")
        if init_std is not None and not init_std > 0:
            raise ConfigError(f"mlr: init_std must be > 0 (or null for the uniform start), got {init_std}")
        self.regions, self.l1, self.l2, self.l21 = int(regions), float(l1), float(l2), float(l21)
        m2 = 2 * self.regions
        self.keys = schema.pooled_keys
        # the schema's tables, 2m wide: (u_1..u_m, w_1..w_m) per id
        init = {} if init_std is None else {"init": "normal", "std": float(init_std)}
        self.sparse = make_embeddings(schema, self.keys, dim=m2, **init) if self.keys else None
        self.dense = nn.Linear(schema.num_dense, m2, bias=False) if schema.num_dense else None
        if self.dense is not None and init_std is not None:
            nn.init.normal_(self.dense.weight, std=float(init_std))
        if self.sparse is None and self.dense is None:
            raise ConfigError("mlr needs at least one sparse or dense feature in the schema")
        self.bias = nn.Parameter(torch.zeros(m2))

    def region_scores(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate scores u_i·x, learner scores w_i·x), each (B, m)."""
        z = self.bias.expand(batch.batch_size, -1)  # (B, 2m)
        if self.sparse is not None:
            kj = batch.sparse if batch.sparse.keys == self.keys else batch.sparse.select(self.keys)
            z = z + self.sparse(kj).stacked().sum(dim=1)  # (B, F, 2m) -> (B, 2m)
        if self.dense is not None:
            z = z + self.dense(batch.dense)  # (B, 2m)
        return z[:, : self.regions], z[:, self.regions :]

    def forward(self, batch: Batch) -> ModelOutput:
        gate, learner = self.region_scores(batch)  # (B, m) each
        log_pi = F.log_softmax(gate, dim=1)  # (B, m)
        log_p = torch.logsumexp(log_pi + F.logsigmoid(learner), dim=1)  # (B,)
        log_q = torch.logsumexp(log_pi + F.logsigmoid(-learner), dim=1)  # (B,)  log(1 - p)
        return ModelOutput(log_p - log_q, {})  # (B,)

    def param_groups(self) -> list[ParamGroup]:
        """The region weights with their penalties: the id tables (rows = ids, 2m wide) and the dense
        weight (2m, Nd) whose rows in the group-lasso sense are its columns (one per dense value)."""
        params = list(self.sparse.embedding_parameters()) if self.sparse is not None else []
        row_dims = [0] * len(params)
        if self.dense is not None:
            params.append(self.dense.weight)
            row_dims.append(1)
        return [ParamGroup("regions", params, l1=self.l1, l2=self.l2, l21=self.l21, row_dims=row_dims)]
