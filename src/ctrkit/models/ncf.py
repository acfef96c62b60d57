"""Neural Collaborative Filtering, NeuMF (He et al., "Neural Collaborative Filtering", WWW 2017;
seed 002 "NeuralCF").

Idea: learn user-item interactions from the two ids alone, with two branches fused at the end:

    GMF:  φ_GMF = p_u^G ⊙ q_i^G                                   (B, Dg)
    MLP:  φ_MLP = MLP([p_u^M ; q_i^M])                            (B, H)
    logit = h^T [φ_GMF ; φ_MLP] + b

The branches have their own embeddings (NeuMF): one table per role of width ``Dg + Dm`` whose rows
are split into the GMF and MLP parts, so a batch is one lookup. The user and item features are the
first sparse feature of the schema's feature groups 'user' and 'item', or the named options
``user_feature`` / ``item_feature``. Other sparse features are not used (as in the paper); with
``use_dense=True`` (an extension, off by default) the dense features join the MLP branch's input:
``φ_MLP = MLP([p_u^M ; q_i^M ; x_dense])``.
"""

from __future__ import annotations

from types import MappingProxyType

import torch
from typing_extensions import Unpack

from ctrkit.batch import Batch
from ctrkit.models._towers import DNNOptions, TowerHead
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import ConfigError, register_model
from ctrkit.nn.embedding_factory import make_embeddings
from ctrkit.schema import Schema, TableSpec


def _role_feature(schema: Schema, role: str, name: str | None) -> str:
    """The sparse feature playing ``role`` ('user' | 'item'): ``name`` or the group's first."""
    sparse = {s.name: s for s in schema.sparse}
    if name is not None:
        if name not in sparse:
            raise ConfigError(
                f"ncf: {role}_feature={name!r} is not a sparse feature of the schema; sparse features: "
                f"{list(sparse)}"
            )
        return name
    in_group = [s.name for s in schema.sparse if s.group == role]
    if not in_group:
        raise ConfigError(
            f"ncf needs a {role} id: no sparse feature has group {role!r}; set group={role!r} on the "
            f"{role} id feature in the schema or pass the option {role}_feature"
        )
    return in_group[0]


@register_model("ncf")
class NCF(CTRModel):
    """``gmf_dim`` / ``mlp_dim``: embedding widths of the two branches (default: the user feature's
    schema dim); ``dnn_hidden`` / ``dnn_activation`` / ``dnn_dropout`` / ``dnn_batch_norm``: the MLP
    branch's tower; ``use_dense``: feed the dense features to the MLP branch."""

    option_defaults = MappingProxyType({"dnn_hidden": (64, 32, 16)})  # the paper's pyramid tower

    def __init__(
        self,
        schema: Schema,
        *,
        user_feature: str | None = None,
        item_feature: str | None = None,
        gmf_dim: int | None = None,
        mlp_dim: int | None = None,
        use_dense: bool = False,
        **dnn: Unpack[DNNOptions],
    ) -> None:
        super().__init__()
        self.user = _role_feature(schema, "user", user_feature)
        self.item = _role_feature(schema, "item", item_feature)
        if self.user == self.item:
            raise ConfigError(f"ncf: user_feature and item_feature are both {self.user!r}; they must differ")
        default = schema.embedding_dim(self.user)
        self.gmf_dim = int(gmf_dim or default)
        self.mlp_dim = int(mlp_dim or default)
        width = self.gmf_dim + self.mlp_dim
        tables = [TableSpec(f"ncf_{k}", schema.tables()[schema.table_of(k)].num_embeddings, width, (k,))
                  for k in (self.user, self.item)]
        self.embedding = make_embeddings(tables=tables)  # (B, 2, Dg + Dm)
        self.use_dense = bool(use_dense) and schema.num_dense > 0
        n_dense = schema.num_dense if self.use_dense else 0
        # h^T [φ_GMF ; MLP(mlp_in)] + b
        self.head = TowerHead(self, 2 * self.mlp_dim + n_dense, dnn, side_features=self.gmf_dim)

    def forward(self, batch: Batch) -> ModelOutput:
        emb = self.embedding(batch.sparse.select([self.user, self.item])).stacked()  # (B, 2, Dg + Dm)
        gmf_u, gmf_i = emb[:, 0, : self.gmf_dim], emb[:, 1, : self.gmf_dim]  # (B, Dg) each
        gmf = gmf_u * gmf_i  # (B, Dg)
        mlp_in = emb[:, :, self.gmf_dim :].flatten(1)  # (B, 2·Dm)
        if self.use_dense:
            mlp_in = torch.cat([mlp_in, batch.dense], dim=1)  # (B, 2·Dm + Nd)
        return ModelOutput(self.head(mlp_in, side=gmf), {})  # (B,)
