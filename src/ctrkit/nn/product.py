"""PNN product layers (Qu et al., "Product-based Neural Networks for User Response Prediction",
ICDM 2016; seed 002 "PNN").

Inputs are field embeddings ``E`` (B, F, D); pairs ``i < j`` in upper-triangle order, ``P = F(F-1)/2``.

* :class:`InnerProduct` — IPNN signals ``p_ij = <v_i, v_j>`` -> (B, P).
* :func:`pooled_outer_product` — the paper's (and the seed's) sum-pooled outer product
  ``p = f_Σ f_Σ^T`` with ``f_Σ = Σ_f v_f`` -> (B, D, D).
* :class:`PNNProductLayer` — the whole product layer ``l_1 = l_z + l_p + b`` -> (B, units).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ctrkit.errors import LayerConfigError
from ctrkit.nn.fm import check_embeddings, pair_indices

__all__ = ["InnerProduct", "PNNProductLayer", "pooled_outer_product"]


class InnerProduct(nn.Module):
    """All pairwise inner products (IPNN): ``p_ij = <v_i, v_j>`` for ``i < j``.

    Input (B, F, D) -> output (B, P), ``P = out_features = F(F-1)/2``. No parameters.
    Computed as the Gram matrix ``E E^T`` (one batched matmul, (B, F, F)) read at the upper triangle, not
    as P gathered pairs: no (B, P, D) intermediates forward or backward (Criteo, F = 26, D = 16: 1.3M floats
    per tensor against the Gram matrix's 173k). Same sums, in the matmul's order.
    """

    def __init__(self, num_fields: int) -> None:
        super().__init__()
        if num_fields < 2:
            raise LayerConfigError(f"InnerProduct: num_fields must be >= 2, got {num_fields}")
        self.num_fields = num_fields
        rows, cols = pair_indices(num_fields)
        self.register_buffer("pairs", rows * num_fields + cols, persistent=False)  # (P,) into the flat (F*F)
        self.out_features = rows.numel()

    def reset_parameters(self) -> None:
        """No parameters."""

    def forward(self, emb: Tensor) -> Tensor:
        check_embeddings("InnerProduct", emb, self.num_fields)
        gram = torch.bmm(emb, emb.transpose(1, 2))  # (B, F, F): <v_i, v_j>
        return gram.flatten(1).index_select(1, self.pairs)  # (B, P), pairs i < j

    def extra_repr(self) -> str:
        return f"num_fields={self.num_fields}"


def pooled_outer_product(emb: Tensor) -> Tensor:
    """Sum-pooled outer product of the PNN paper (OPNN) and seed 002:

        p = Σ_i Σ_j v_i v_j^T = f_Σ f_Σ^T,   f_Σ = Σ_f v_f

    Input (B, F, D) -> (B, D, D). Reduces the F² outer products to one D×D matrix at O(F·D + D²).
    """
    f_sum = emb.sum(dim=1)  # (B, D)
    return f_sum.unsqueeze(2) * f_sum.unsqueeze(1)  # (B, D, D)


_MODES = ("inner", "outer", "both")


class PNNProductLayer(nn.Module):
    """The PNN product layer, seed 002: output = ``l_z + l_p + b`` (all with ``units`` neurons).

        l_z^n = <W_z^n, z>,  z = E (the F×D linear signals, flattened)
        inner:  l_p^n = Σ_{i<j} W_p^n[ij] <v_i, v_j>                (IPNN, full weight per pair)
        outer:  l_p^n = <W_p^n, f_Σ f_Σ^T>                          (OPNN, sum-pooled outer product)
        both:   l_p = l_p^inner + l_p^outer                         (PNN*)
        l_1 = l_z + l_p + b

    Input (B, F, D) -> output (B, units), ``out_features = units``. No activation here: the model
    applies ReLU and its MLP on top (and may concat dense features, as the seed says).
    Note: IPNN's inner-product weight is kept full-rank (F(F-1)/2 per unit) rather than the paper's
    rank-1 ``θ_i θ_j`` factorisation; with F ≤ ~40 fields it is small.
    """

    def __init__(self, num_fields: int, embedding_dim: int, units: int, *, mode: str = "inner") -> None:
        super().__init__()
        if mode not in _MODES:
            raise LayerConfigError(f"PNNProductLayer: unknown mode={mode!r}; valid: {', '.join(_MODES)}")
        if num_fields < 2:
            raise LayerConfigError(f"PNNProductLayer: num_fields must be >= 2, got {num_fields}")
        if units < 1:
            raise LayerConfigError(f"PNNProductLayer: units must be >= 1, got {units}")
        self.num_fields, self.embedding_dim, self.units, self.mode = num_fields, embedding_dim, units, mode
        self.linear_z = nn.Linear(num_fields * embedding_dim, units, bias=False)
        self.inner = InnerProduct(num_fields) if mode in ("inner", "both") else None
        self.linear_inner = (
            nn.Linear(num_fields * (num_fields - 1) // 2, units, bias=False) if self.inner is not None else None
        )
        self.linear_outer = (
            nn.Linear(embedding_dim * embedding_dim, units, bias=False) if mode in ("outer", "both") else None
        )
        self.bias = nn.Parameter(torch.zeros(units))
        self.out_features = units
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (self.linear_z, self.linear_inner, self.linear_outer):
            if lin is not None:
                nn.init.xavier_uniform_(lin.weight)
        nn.init.zeros_(self.bias)

    def forward(self, emb: Tensor) -> Tensor:
        check_embeddings("PNNProductLayer", emb, self.num_fields, self.embedding_dim)
        out = self.linear_z(emb.flatten(1)) + self.bias  # (B, units)
        if self.inner is not None and self.linear_inner is not None:
            out = out + self.linear_inner(self.inner(emb))  # (B, P) -> (B, units)
        if self.linear_outer is not None:
            out = out + self.linear_outer(pooled_outer_product(emb).flatten(1))  # (B, D*D) -> (B, units)
        return out

    def extra_repr(self) -> str:
        return (
            f"num_fields={self.num_fields}, embedding_dim={self.embedding_dim}, units={self.units}, "
            f"mode={self.mode!r}"
        )
