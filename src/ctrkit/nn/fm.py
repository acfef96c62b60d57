"""Factorization-machine family interactions on field embeddings: FM, FFM, NFM's bi-interaction.

All layers are tensor-in/tensor-out; inputs are field embeddings ``E`` of shape (B, F, D)
(FFM: field-aware embeddings (B, F, F, D)). Pairs ``(i, j)`` with ``i < j`` are enumerated in
row-major upper-triangle order (``torch.triu_indices(F, F, 1)``): (0,1), (0,2), ..., (F-2, F-1);
``P = F(F-1)/2`` pairs. Every pairwise layer in :mod:`ctrkit.nn` uses this order.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ctrkit.errors import LayerConfigError

__all__ = [
    "BiInteractionPooling",
    "FFMInteraction",
    "FMInteraction",
    "LayerConfigError",
    "check_embeddings",
    "pair_indices",
]



def pair_indices(num_fields: int) -> tuple[Tensor, Tensor]:
    """Row and column indices of the ``P = F(F-1)/2`` pairs ``i < j`` in upper-triangle order.

    Returns two int64 tensors of shape (P,).
    """
    idx = torch.triu_indices(num_fields, num_fields, offset=1)
    return idx[0].contiguous(), idx[1].contiguous()


def pair_blocks(num_fields: int) -> list[tuple[int, int, int]]:
    """(left field i, first pair s, pairs k) of every left field with a pair, in :func:`pair_indices`' upper-triangle
    order: pairs s .. s + k - 1 are (i, i + 1) .. (i, F - 1)."""
    return [(i, i * (2 * num_fields - i - 1) // 2, num_fields - 1 - i) for i in range(num_fields - 1)]


def check_embeddings(layer: str, emb: Tensor, num_fields: int | None = None, dim: int | None = None) -> None:
    """Raise :class:`LayerConfigError` unless ``emb`` is (B, F, D) with the expected F and D."""
    if emb.dim() != 3:
        raise LayerConfigError(
            f"{layer}: expected field embeddings of shape (B, F, D), got shape {list(emb.shape)}"
        )
    if num_fields is not None and emb.shape[1] != num_fields:
        raise LayerConfigError(
            f"{layer}: built with num_fields={num_fields} but the input has {emb.shape[1]} fields "
            f"(shape {list(emb.shape)})"
        )
    if dim is not None and emb.shape[2] != dim:
        raise LayerConfigError(
            f"{layer}: built with embedding_dim={dim} but the input has D={emb.shape[2]} "
            f"(shape {list(emb.shape)}); project the fields to a common dim first"
        )


class FMInteraction(nn.Module):
    """Second-order factorization-machine term (Rendle, "Factorization Machines", ICDM 2010).

    With field embeddings ``v_f = E[:, f]`` (already multiplied by the feature value ``x_f``):

        y = Σ_{i<j} <v_i, v_j> = ½ Σ_d [ (Σ_f v_{f,d})² − Σ_f v_{f,d}² ]

    which costs O(F·D) instead of O(F²·D) (seed 002 "FM": the upper triangle of the symmetric
    Gram matrix is (sum of all entries − trace) / 2).

    Input (B, F, D) -> output (B, 1) (``out_features = 1``). No parameters; the first-order
    term and bias live in the model (a linear layer over the features).
    """

    out_features: int = 1

    def __init__(self) -> None:
        super().__init__()

    def reset_parameters(self) -> None:
        """No parameters; present so every layer can be re-initialised the same way."""

    def forward(self, emb: Tensor) -> Tensor:
        check_embeddings("FMInteraction", emb)
        if not torch.jit.is_scripting():
            return self._with_gradient(emb)
        return _fm_second_order(emb)

    @torch.jit.unused
    def _with_gradient(self, emb: Tensor) -> Tensor:
        """Training (a gradient to compute, not under torch.export): one autograd node (:class:`_FMNode`)."""
        if torch.is_grad_enabled() and emb.requires_grad and not torch.compiler.is_exporting():
            return _FMNode.apply(emb)
        return _fm_second_order(emb)


def _fm_second_order(emb: Tensor) -> Tensor:
    """½ Σ_d [(Σ_f v_fd)² − Σ_f v_fd²]: (B, F, D) -> (B, 1)."""
    square_of_sum = emb.sum(dim=1).pow(2)  # (B, D)
    sum_of_square = emb.pow(2).sum(dim=1)  # (B, D)
    return 0.5 * (square_of_sum - sum_of_square).sum(dim=1, keepdim=True)  # (B, 1)


class _FMNode(torch.autograd.Function):
    """:func:`_fm_second_order` as one autograd node, for training. Forward ``½ (<s, s> − <vec E, vec E>)`` per
    sample (s = Σ_f v_f: one pass over (B, F, D) for s, one dot product over the flattened fields, no (B, F, D)
    squares); backward the closed form ``dE[b, f] = g_b (s_b − v_bf)`` in one ``addcmul``, instead of autograd's
    seven nodes (two pow backwards, the sums expanded over F, their accumulation). The same sums in another
    order (rounding: ~1e-7 relative; tests/nn/test_fm_node.py). Forward + backward at (1,024, 9, 16), one
    thread: 0.52-0.60 -> 0.33-0.35 ms."""

    @staticmethod
    def forward(ctx: Any, emb: Tensor) -> Tensor:  # type: ignore[override]
        s = emb.sum(dim=1)  # (B, D)
        flat = emb.reshape(emb.shape[0], -1)  # (B, F*D)
        ctx.save_for_backward(emb, s)
        return torch.linalg.vecdot(s, s).sub_(torch.linalg.vecdot(flat, flat)).mul_(0.5).unsqueeze(1)  # (B, 1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:  # type: ignore[override]
        emb, s = ctx.saved_tensors
        return torch.addcmul((s * grad).unsqueeze(1), emb, grad.unsqueeze(2), value=-1)  # (B, F, D): g (s − v)


class BiInteractionPooling(nn.Module):
    """NFM bi-interaction pooling (He & Chua, "Neural Factorization Machines", SIGIR 2017).

        f_BI(E) = Σ_{i<j} v_i ⊙ v_j = ½ [ (Σ_f v_f)² − Σ_f v_f² ]      (element-wise)

    i.e. the FM term before the sum over D. Input (B, F, D) -> output (B, D) (``out_features = D``
    once known; the layer is parameter-free, so pass ``embedding_dim`` to get ``out_features``).
    """

    def __init__(self, *, embedding_dim: int | None = None) -> None:
        super().__init__()
        if embedding_dim is not None and embedding_dim < 1:
            raise LayerConfigError(f"BiInteractionPooling: embedding_dim must be >= 1, got {embedding_dim}")
        self.embedding_dim = embedding_dim

    @property
    def out_features(self) -> int:
        if self.embedding_dim is None:
            raise LayerConfigError(
                "BiInteractionPooling: out_features is D; build the layer with embedding_dim=D to read it"
            )
        return self.embedding_dim

    def reset_parameters(self) -> None:
        """No parameters."""

    def forward(self, emb: Tensor) -> Tensor:
        check_embeddings("BiInteractionPooling", emb, dim=self.embedding_dim)
        square_of_sum = emb.sum(dim=1).pow(2)  # (B, D)
        sum_of_square = emb.pow(2).sum(dim=1)  # (B, D)
        return 0.5 * (square_of_sum - sum_of_square)  # (B, D)


class FFMInteraction(nn.Module):
    """Field-aware FM second-order term (Juan et al., "Field-aware Factorization Machines for CTR
    Prediction", RecSys 2016; seed 002 "FFM").

    Each feature keeps one latent vector per *other* field: ``v_{i,f_j}`` is the embedding of the
    feature of field ``i`` used when it meets field ``j``. Input ``E`` of shape (B, F, F, D) with
    ``E[b, i, j] = v_{i, f_j}``; output

        y = Σ_{i<j} <v_{i,f_j}, v_{j,f_i}> = Σ_{i<j} Σ_d E[b,i,j,d] · E[b,j,i,d]      -> (B, 1)

    computed with one gather over precomputed upper-triangle indices (O(F²·D), as FFM must be).

    How a model builds the input: give every field an embedding table of width ``F·D`` (or one
    fused table looked up once per field), look up the id of field ``i`` to get (B, F·D), stack the
    fields to (B, F, F·D) and ``reshape(B, F, F, D)``. ``E[:, i, i]`` is unused (no self pair).
    """

    out_features: int = 1

    def __init__(self, num_fields: int) -> None:
        super().__init__()
        if num_fields < 2:
            raise LayerConfigError(
                f"FFMInteraction: num_fields must be >= 2 to have a pair of fields, got {num_fields}"
            )
        self.num_fields = num_fields
        rows, cols = pair_indices(num_fields)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)

    def reset_parameters(self) -> None:
        """No parameters."""

    def forward(self, emb: Tensor) -> Tensor:
        f = self.num_fields
        if emb.dim() != 4 or emb.shape[1] != f or emb.shape[2] != f:
            raise LayerConfigError(
                f"FFMInteraction: expected field-aware embeddings of shape (B, {f}, {f}, D), "
                f"got {list(emb.shape)}"
            )
        left = emb[:, self.rows, self.cols]  # (B, P, D)   v_{i, f_j}
        right = emb[:, self.cols, self.rows]  # (B, P, D)  v_{j, f_i}
        return (left * right).sum(dim=(1, 2)).unsqueeze(1)  # (B, 1)

    def extra_repr(self) -> str:
        return f"num_fields={self.num_fields}"
