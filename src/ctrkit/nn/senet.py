"""FiBiNET layers (Huang et al., "FiBiNET: Combining Feature Importance and Bilinear feature
Interaction for Click-Through Rate Prediction", RecSys 2019; seed 002 "FIBINET"): SENET field
re-weighting and the bilinear interaction layer."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ctrkit.errors import LayerConfigError
from ctrkit.nn.bilinear_pairs import bilinear_pairs_concat, bilinear_pairs_shared
from ctrkit.nn.bilinear_pairs_native import native_senet_shared_pairs
from ctrkit.nn.fm import check_embeddings, pair_indices

__all__ = ["SENET", "BilinearInteraction", "bilinear_concat", "bilinear_shared_concat", "senet_bilinear_shared_concat"]

_POOLINGS = ("mean", "max")


class SENET(nn.Module):
    """Squeeze-and-excitation over fields: learn one importance weight per field and re-weight.

        squeeze:     z_f = mean_d E[:, f, d]   (or max_d)                       (B, F)
        excitation:  a = ReLU(W_2 ReLU(W_1 z)),  W_1 ∈ R^{F'×F}, W_2 ∈ R^{F×F'}  (B, F),  F' = max(1, F // r)
        re-weight:   V = E ⊙ a  (a_f scales field f's whole vector)            (B, F, D)

    The two FC layers have no bias (the seed: the excitation MLP learns interactions, "不会加入偏置项").
    Input (B, F, D) -> output (B, F, D): the shape is unchanged, so there is no ``out_features``.
    Options (keyword-only): ``reduction_ratio`` r (default 3, the paper's value), ``pooling`` 'mean'
    (paper) | 'max'. :meth:`field_weights` returns ``a`` for inspection.
    """

    def __init__(self, num_fields: int, *, reduction_ratio: float = 3.0, pooling: str = "mean") -> None:
        super().__init__()
        if num_fields < 1:
            raise LayerConfigError(f"SENET: num_fields must be >= 1, got {num_fields}")
        if reduction_ratio <= 0:
            raise LayerConfigError(f"SENET: reduction_ratio must be > 0, got {reduction_ratio}")
        if pooling not in _POOLINGS:
            raise LayerConfigError(f"SENET: unknown pooling={pooling!r}; valid: {', '.join(_POOLINGS)}")
        self.num_fields, self.reduction_ratio, self.pooling = num_fields, reduction_ratio, pooling
        self.hidden = max(1, int(num_fields // reduction_ratio))
        self.excite = nn.Sequential(
            nn.Linear(num_fields, self.hidden, bias=False),
            nn.ReLU(),
            nn.Linear(self.hidden, num_fields, bias=False),
            nn.ReLU(),
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in self.excite:
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)

    def field_weights(self, emb: Tensor) -> Tensor:
        """Excitation weights ``a`` (B, F)."""
        check_embeddings("SENET", emb, self.num_fields)
        z = emb.mean(dim=2) if self.pooling == "mean" else emb.amax(dim=2)  # (B, F)
        return self.excite(z)  # (B, F)

    def forward(self, emb: Tensor) -> Tensor:
        return emb * self.field_weights(emb).unsqueeze(2)  # (B, F, D)

    def extra_repr(self) -> str:
        return f"num_fields={self.num_fields}, hidden={self.hidden}, pooling={self.pooling!r}"


_BILINEAR_TYPES = ("field_all", "field_each", "field_interaction")


class BilinearInteraction(nn.Module):
    """Bilinear feature interaction, for every pair ``i < j`` (upper-triangle order):

        field_all:          p_ij = (v_i W) ⊙ v_j          one W ∈ R^{D×D}                   D·D params
        field_each:         p_ij = (v_i W_i) ⊙ v_j        W_i per left field i = 0..F-2    (F−1)·D·D params
        field_interaction:  p_ij = (v_i W_ij) ⊙ v_j       W_ij per pair                    F(F−1)/2·D·D params

    ``v_i W`` is the row vector ``v_i`` times W (``(v_i W)_e = Σ_d v_{i,d} W[d,e]``). field_each keeps
    only F−1 matrices, as seed 002 notes: the last field is never the left operand of a pair.
    Input (B, F, D) -> output (B, P, D), ``P = F(F-1)/2`` (``out_features = P·D`` when flattened).
    Option ``bilinear_type`` (keyword-only; default 'field_interaction', the paper's default).
    """

    def __init__(
        self, num_fields: int, embedding_dim: int, *, bilinear_type: str = "field_interaction"
    ) -> None:
        super().__init__()
        if bilinear_type not in _BILINEAR_TYPES:
            raise LayerConfigError(
                f"BilinearInteraction: unknown bilinear_type={bilinear_type!r}; "
                f"valid: {', '.join(_BILINEAR_TYPES)}"
            )
        if num_fields < 2:
            raise LayerConfigError(f"BilinearInteraction: num_fields must be >= 2, got {num_fields}")
        self.num_fields, self.embedding_dim, self.bilinear_type = num_fields, embedding_dim, bilinear_type
        rows, cols = pair_indices(num_fields)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)
        self.num_pairs = rows.numel()
        d = embedding_dim
        shape = {
            "field_all": (d, d),
            "field_each": (num_fields - 1, d, d),
            "field_interaction": (self.num_pairs, d, d),
        }[bilinear_type]
        self.weight = nn.Parameter(torch.empty(shape))
        self.out_features = self.num_pairs * d
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Each W: N(0, 1/D) (variance-preserving for v W)."""
        nn.init.normal_(self.weight, mean=0.0, std=self.embedding_dim**-0.5)

    def forward(self, emb: Tensor) -> Tensor:
        check_embeddings("BilinearInteraction", emb, self.num_fields, self.embedding_dim)
        # index_select, not emb[:, rows]: the same values, with index_add_ as the backward instead of advanced
        # indexing's accumulating index_put_; field_interaction gathers straight into the pair-major layout its
        # batched matmul needs, (P, B, D), and returns a (B, P, D) view of the pair-major product
        if self.bilinear_type == "field_all":
            left = torch.matmul(emb, self.weight).index_select(1, self.rows)  # (B, F, D) -> (B, P, D)
        elif self.bilinear_type == "field_each":
            vw = torch.einsum("bfd,fde->bfe", emb[:, :-1], self.weight)  # (B, F-1, D): v_i W_i
            left = vw.index_select(1, self.rows)  # (B, P, D); rows <= F-2 always
        else:
            fields = emb.transpose(0, 1)  # (F, B, D)
            left = torch.bmm(fields.index_select(0, self.rows), self.weight)  # (P, B, D): v_i W_ij
            return (left * fields.index_select(0, self.cols)).transpose(0, 1)  # (B, P, D)
        return left * emb.index_select(1, self.cols)  # (B, P, D)

    def extra_repr(self) -> str:
        return (
            f"num_fields={self.num_fields}, embedding_dim={self.embedding_dim}, "
            f"bilinear_type={self.bilinear_type!r}"
        )


def bilinear_concat(layers: list[BilinearInteraction], embs: list[Tensor], tail: Tensor | None = None) -> Tensor:
    """``[flat layers[0](embs[0]) | flat layers[1](embs[1]) | ... | tail]`` -> (B, Σ out_features + Nt).

    ``field_interaction`` layers of one shape go through one autograd node (:mod:`ctrkit.nn.bilinear_pairs`: the
    same values, no gathers, written straight into the result); other types, and ``torch.export``, run each
    layer and concatenate.
    """
    for layer, emb in zip(layers, embs):
        check_embeddings("BilinearInteraction", emb, layer.num_fields, layer.embedding_dim)
    fused = (not torch.compiler.is_exporting() and len(layers) == len(embs) > 0
             and all(layer.bilinear_type == "field_interaction" for layer in layers)
             and len({(layer.num_fields, layer.embedding_dim) for layer in layers}) == 1)
    if fused:
        return bilinear_pairs_concat(list(embs), [layer.weight for layer in layers], tail)
    parts = [layer(emb).flatten(1) for layer, emb in zip(layers, embs)]
    return torch.cat(parts if tail is None else [*parts, tail], dim=1)


def bilinear_shared_concat(layer: BilinearInteraction, emb: Tensor, scale: Tensor, tail: Tensor | None = None) -> Tensor:
    """``[flat layer(emb) | flat layer(scale ⊙ emb) | tail]`` -> (B, 2·P·D + Nt): one bilinear layer applied to the
    raw and the re-weighted embeddings (``scale`` (B, F): SENET's field weights a), as DeepCTR-Torch's FiBiNET does.

    Every bilinear type is linear in each of its two fields, so the re-weighted layer's output is the raw one's
    scaled per pair, ``q_ij = a_i a_j p_ij``: computed that way (exact algebra, rounding aside) instead of a second
    pass through the layer. ``field_interaction`` outside ``torch.export`` goes through one autograd node
    (:func:`ctrkit.nn.bilinear_pairs.bilinear_pairs_shared`).
    """
    check_embeddings("BilinearInteraction", emb, layer.num_fields, layer.embedding_dim)
    if scale.shape != emb.shape[:2]:
        raise LayerConfigError(f"bilinear_shared_concat: scale must be (B, F) = {tuple(emb.shape[:2])}, "
                               f"got {tuple(scale.shape)}")
    if layer.bilinear_type == "field_interaction" and not torch.compiler.is_exporting():
        return bilinear_pairs_shared(emb, scale, layer.weight, tail)
    p = layer(emb)  # (B, P, D)
    q = p * (scale.index_select(1, layer.rows) * scale.index_select(1, layer.cols)).unsqueeze(2)  # (B, P, D)
    parts = [p.flatten(1), q.flatten(1)]
    return torch.cat(parts if tail is None else [*parts, tail], dim=1)


def senet_bilinear_shared_concat(senet: SENET, layer: BilinearInteraction, emb: Tensor,
                                 tail: Tensor | None = None) -> Tensor:
    """``bilinear_shared_concat(layer, emb, senet.field_weights(emb), tail)``: the same function, with SENET's field
    weights computed inside the bilinear node's native kernels where they apply (mean pooling, ``field_interaction``,
    the CPU in float32 / float64, outside ``torch.export``; :func:`ctrkit.nn.bilinear_pairs_native.
    native_senet_shared_pairs`), else with the modules as written."""
    fits = (emb.dim() == 3 and emb.shape[1] == layer.num_fields == senet.num_fields
            and emb.shape[2] == layer.embedding_dim)
    if fits and senet.pooling == "mean" and layer.bilinear_type == "field_interaction" and not torch.compiler.is_exporting():
        out = native_senet_shared_pairs(emb, senet.excite[0].weight, senet.excite[2].weight, layer.weight, tail)
        if out is not None:
            return out
    return bilinear_shared_concat(layer, emb, senet.field_weights(emb), tail)
