"""DCN-V2 (Wang et al., "DCN V2: Improved Deep & Cross Network and Practical Lessons for Web-scale
Learning to Rank Systems", WWW 2021; seed 001 §3 CrossNet / LowRankMixtureCrossNet).

Idea: make the cross layer expressive with a full weight matrix (or a mixture of low-rank experts,
"DCN-Mix"), and combine it with a DNN either stacked (cross then deep) or in parallel.

    x_0 = [e_1; ...; e_F; dense]                                      (B, N)
    full:   x_{l+1} = x_0 ⊙ (W_l x_l + b_l) + x_l                     W_l ∈ R^{N×N}
    low_rank_mixture: x_{l+1} = Σ_e g_e(x_l) x_0 ⊙ (U_l^e f(C_l^e f(V_l^e x_l)) + b_l) + x_l     rank K, E experts
    stacked:  logit = w^T MLP(Cross(x_0)) + b
    parallel: logit = w^T [Cross(x_0); MLP(x_0)] + b

``dnn_hidden=()`` gives the cross-only network (both structures then coincide).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Literal

import torch
from torch import nn
from typing_extensions import Unpack

from ctrkit.batch import Batch
from ctrkit.models._towers import DNNOptions, TowerHead, check_choice, check_min, dnn_options, layer_options
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import register_model
from ctrkit.nn.crossnet import CrossNet, LowRankMixtureCrossNet
from ctrkit.nn.inputs import ZOO_INIT_STD, FieldEmbedding
from ctrkit.schema import Schema

CROSS_TYPES = ("full", "low_rank_mixture")
STRUCTURES = ("stacked", "parallel")


@register_model("dcnv2")
class DCNv2(CTRModel):
    """DCN-V2 with ``cross_type`` 'full' (full-rank CrossNet) or 'low_rank_mixture' (LowRankMixtureCrossNet
    with ``cross_rank`` K, ``cross_experts`` E and activation ``cross_activation``) and ``structure``
    'stacked' | 'parallel'. Option names and values as DLRM's cross net."""

    renamed_options = MappingProxyType({"rank": "cross_rank", "experts": "cross_experts",
                                        "mix_activation": "cross_activation"})
    renamed_values = MappingProxyType({"cross_type": {"matrix": "full", "mix": "low_rank_mixture"}})

    def __init__(
        self,
        schema: Schema,
        *,
        embedding_init_std: float | None = ZOO_INIT_STD,
        cross_type: Literal["full", "low_rank_mixture"] = "full",
        cross_layers: int = 3,
        cross_rank: int = 32,
        cross_experts: int = 4,
        cross_activation: str = "relu",
        structure: Literal["stacked", "parallel"] = "parallel",
        **dnn: Unpack[DNNOptions],
    ) -> None:
        super().__init__()
        check_choice("dcnv2", "cross_type", cross_type, CROSS_TYPES)
        check_choice("dcnv2", "structure", structure, STRUCTURES)
        check_min("dcnv2", "cross_layers", cross_layers, 1)
        self.structure = structure
        self.embedding = FieldEmbedding(schema, model="dcnv2", init_std=embedding_init_std)
        n = self.embedding.out_features + schema.num_dense
        if cross_type == "full":
            self.cross: nn.Module = CrossNet(n, num_layers=cross_layers)  # (B, N) -> (B, N)
        else:
            check_min("dcnv2", "cross_rank", cross_rank, 1)
            check_min("dcnv2", "cross_experts", cross_experts, 1)
            with layer_options("dcnv2", "cross_activation"):
                self.cross = LowRankMixtureCrossNet(n, num_layers=cross_layers, num_experts=cross_experts,
                                                    low_rank=cross_rank, activation=cross_activation)
        # stacked: w^T MLP(cross(x0)); parallel: w^T [cross(x0); MLP(x0)]; the cross net alone for dnn_hidden=()
        self.parallel = structure == "parallel" and bool(dnn_options(self, dnn)["dnn_hidden"])
        self.head = TowerHead(self, n, dnn, side_features=n if self.parallel else 0)

    def forward(self, batch: Batch) -> ModelOutput:
        x0 = torch.cat([self.embedding.concat(batch), batch.dense], dim=1)  # (B, N)
        cross = self.cross(x0)  # (B, N)
        return ModelOutput(self.head(x0, side=cross) if self.parallel else self.head(cross), {})  # (B,)
