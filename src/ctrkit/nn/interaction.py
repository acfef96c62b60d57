"""DLRM interaction arches (seed 001 §1-4): dense ``[B, D]`` and sparse ``[B, F, D]`` -> ``[B, out_features]``.

All three start from ``C = cat(dense.unsqueeze(1), sparse)`` of shape ``[B, F+1, D]``:

- ``DotInteraction``: dense itself, then the dot product of every pair i < j of the F+1 rows of C
  (strict upper triangle of ``C C^T``, row-major): ``out = D + F(F+1)/2`` (D=128, F=26 -> 479).
- ``DCNInteraction``: a cross net over ``C`` flattened: ``out = (F+1) D``.
- ``ProjectionInteraction``: two MLP branches over flattened C give ``Y [B, F1, D]`` and
  ``Z [B, D, F2]``; ``out = cat(dense, flat(Y Z)) = D + F1 F2`` (D=128, F1=2, F2=4 -> 136).

Built with ``with_dense=False`` (a model without dense features) they take ``dense=None`` and run over the
sparse rows alone: ``C = sparse [B, F, D]``, and nothing stands in the dense vector's place in the output
(dot: ``F(F-1)/2`` pairs, F >= 2; dcn: ``F D``; projection: ``F1 F2``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ctrkit.errors import LayerConfigError
from ctrkit.nn.activation import ActivationSpec
from ctrkit.nn.mlp import MLP
from ctrkit.nn.pair_dots_native import native_pair_dots


def _check_inputs(name: str, dense: torch.Tensor | None, sparse: torch.Tensor, F: int, D: int,
                  with_dense: bool = True) -> None:
    if not with_dense:
        if dense is not None or sparse.dim() != 3 or sparse.shape[1:] != (F, D):
            raise LayerConfigError(
                f"{name} was built with_dense=False: it expects dense=None and sparse [B, {F}, {D}], got "
                f"{None if dense is None else tuple(dense.shape)} and {tuple(sparse.shape)}")
        return
    if dense is None:
        raise LayerConfigError(f"{name} was built with_dense=True but got dense=None; build it with_dense=False "
                               "for a model without dense features")
    if dense.dim() != 2 or sparse.dim() != 3 or sparse.shape[1:] != (F, D) or dense.shape[1] != D:
        raise LayerConfigError(
            f"{name} expects dense [B, {D}] and sparse [B, {F}, {D}], got {tuple(dense.shape)} and "
            f"{tuple(sparse.shape)}; the dense arch must end in embedding_dim={D} units"
        )


def _combined(dense: torch.Tensor | None, sparse: torch.Tensor) -> torch.Tensor:
    """``C``: the dense vector as row 0 above the F sparse rows, or the sparse rows alone without one."""
    return sparse if dense is None else torch.cat((dense.unsqueeze(1), sparse), dim=1)  # (B, F(+1), D)


class _PairDots(torch.autograd.Function):
    """``pairs = flat(C C^T)[:, flat_index]`` with a one-matmul backward (training only).

    Autograd's own backward of ``bmm(C, C^T)`` then ``index_select`` fills a zero ``[B, n^2]`` gradient, scatters
    the pairs into it, runs two bmm (one per operand) and adds them. The Gram matrix is symmetric, so with
    ``G`` the pair gradients mirrored into both triangles (``G[i, j] = G[j, i] = dY_ij``, diagonal 0),
    ``dC = G C`` is one bmm, and ``G`` is one gather of ``[dY, 0]`` by ``mirror_index``.
    Under autocast the products run in the autocast dtype (as autocast runs ``bmm``) and ``dC`` comes back in C's.
    """

    @staticmethod
    def forward(ctx: Any, combined: torch.Tensor, flat_index: torch.Tensor,  # type: ignore[override]
                mirror_index: torch.Tensor) -> torch.Tensor:
        dev = combined.device.type
        c = combined
        if torch.is_autocast_enabled(dev):
            c = combined.to(torch.get_autocast_dtype(dev))
        B = c.shape[0]
        with torch.autocast(dev, enabled=False):
            gram = torch.bmm(c, c.transpose(1, 2))  # (B, n, n)
            pairs = gram.view(B, -1).index_select(1, flat_index)  # (B, P)
        ctx.save_for_backward(c, mirror_index)
        ctx.input_dtype = combined.dtype
        return pairs

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        c, mirror_index = ctx.saved_tensors
        B, n = c.shape[0], c.shape[1]
        g = torch.cat((grad.to(c.dtype), grad.new_zeros(B, 1, dtype=c.dtype)), dim=1)  # (B, P + 1): 0 last
        sym = g.index_select(1, mirror_index).view(B, n, n)  # (B, n, n) symmetric, zero diagonal
        return torch.bmm(sym, c).to(ctx.input_dtype), None, None  # (B, n, D)


class DotInteraction(nn.Module):
    """Pairwise dot products (seed 001 §2): ``[B, D], [B, F, D] -> [B, D + F(F+1)/2]``.

    ``y = [d, (c_i · c_j for 0 <= i < j <= F)]`` with ``c_0 = d`` and ``c_{f+1} = s_f``. The pairs are
    read from the flattened ``[B, (F+1)^2]`` Gram matrix with one precomputed flat index. With
    ``with_dense=False``: ``None, [B, F, D] -> [B, F(F-1)/2]``, ``y = (s_i · s_j for 0 <= i < j < F)``.
    """

    def __init__(self, num_sparse_features: int, embedding_dim: int, *, with_dense: bool = True) -> None:
        super().__init__()
        self.num_sparse_features = F = int(num_sparse_features)
        self.embedding_dim = D = int(embedding_dim)
        self.with_dense = bool(with_dense)
        if F < 1 or D < 1:
            raise LayerConfigError(f"DotInteraction needs num_sparse_features >= 1 and embedding_dim >= 1, got {F}, {D}")
        n = F + 1 if self.with_dense else F  # rows of C
        if n < 2:
            raise LayerConfigError("DotInteraction with_dense=False needs num_sparse_features >= 2 (one pair to "
                                   f"multiply), got {F}")
        i, j = torch.triu_indices(n, n, offset=1)
        self.register_buffer("flat_index", i * n + j, persistent=False)  # (n(n-1)/2,)
        mirror = torch.full((n, n), len(i), dtype=torch.long)  # position in [pairs, 0]: the diagonal reads the 0
        mirror[i, j] = mirror[j, i] = torch.arange(len(i))
        self.register_buffer("mirror_index", mirror.view(-1), persistent=False)  # (n^2,)
        self.out_features = (D if self.with_dense else 0) + n * (n - 1) // 2

    def forward(self, dense: torch.Tensor | None, sparse: torch.Tensor) -> torch.Tensor:
        _check_inputs("DotInteraction", dense, sparse, self.num_sparse_features, self.embedding_dim, self.with_dense)
        B = sparse.shape[0]
        combined = _combined(dense, sparse)  # (B, n, D), n = F+1 (F without dense)
        if combined.requires_grad and torch.is_grad_enabled() and not torch.compiler.is_compiling():
            out = native_pair_dots(combined, dense)  # (B, [D +] n(n-1)/2): the copies native, or None
            if out is not None:
                return out
            pairs = _PairDots.apply(combined, self.flat_index, self.mirror_index)  # (B, n(n-1)/2)
        else:  # inference, export, compile: the plain ops
            gram = torch.bmm(combined, combined.transpose(1, 2))  # (B, n, n)
            pairs = gram.view(B, -1).index_select(1, self.flat_index)  # (B, n(n-1)/2)
        return pairs if dense is None else torch.cat((dense, pairs), dim=1)  # (B, [D +] n(n-1)/2)


class DCNInteraction(nn.Module):
    """Cross net over the flattened combined features (seed 001 §3): ``-> [B, (F+1) D]``.

    ``crossnet`` is any ``[B, N] -> [B, N]`` module with N = (F+1) D (CrossNet, LowRankCrossNet, ...);
    with ``with_dense=False`` N = F D, over the sparse rows alone.
    """

    def __init__(self, num_sparse_features: int, embedding_dim: int, crossnet: nn.Module, *,
                 with_dense: bool = True) -> None:
        super().__init__()
        self.num_sparse_features = int(num_sparse_features)
        self.embedding_dim = int(embedding_dim)
        self.with_dense = bool(with_dense)
        rows = self.num_sparse_features + int(self.with_dense)
        N = rows * self.embedding_dim
        n_in = getattr(crossnet, "in_features", N)
        if n_in != N:
            raise LayerConfigError(
                f"DCNInteraction: crossnet has in_features={n_in}, but {'(F+1)' if self.with_dense else 'F'}*D = "
                f"{rows}*{self.embedding_dim} = {N}"
            )
        self.crossnet = crossnet
        self.out_features = N

    def forward(self, dense: torch.Tensor | None, sparse: torch.Tensor) -> torch.Tensor:
        _check_inputs("DCNInteraction", dense, sparse, self.num_sparse_features, self.embedding_dim, self.with_dense)
        combined = _combined(dense, sparse)  # (B, F(+1), D)
        return self.crossnet(combined.reshape(sparse.shape[0], -1))  # (B, N)


class ProjectionInteraction(nn.Module):
    """Projection interaction (seed 001 §4, torchrec InteractionProjectionArch).

    ``Y = branch1(flat C).view(B, F1, D)``, ``Z = branch2(flat C).view(B, D, F2)``,
    ``out = cat(dense, flat(Y Z))`` of width ``D + F1 F2``. Each branch is an MLP over
    ``(F+1) D`` inputs with the given layer sizes (activation after every layer, as torchrec's MLP);
    the last size of each branch must be a multiple of D. With ``with_dense=False``: C is the sparse
    rows alone (branches over ``F D`` inputs) and ``out = flat(Y Z)``, of width ``F1 F2``.
    """

    def __init__(
        self,
        num_sparse_features: int,
        embedding_dim: int,
        interaction_branch1_layer_sizes: Sequence[int],
        interaction_branch2_layer_sizes: Sequence[int],
        *,
        activation: ActivationSpec = "relu",
        with_dense: bool = True,
    ) -> None:
        super().__init__()
        self.num_sparse_features = F = int(num_sparse_features)
        self.embedding_dim = D = int(embedding_dim)
        self.with_dense = bool(with_dense)
        rows = F + int(self.with_dense)
        projected = []
        for name, sizes in (("interaction_branch1_layer_sizes", interaction_branch1_layer_sizes),
                            ("interaction_branch2_layer_sizes", interaction_branch2_layer_sizes)):
            if not sizes:
                raise LayerConfigError(f"ProjectionInteraction: {name} is empty; give at least one layer size")
            if sizes[-1] % D:
                raise LayerConfigError(
                    f"ProjectionInteraction: {name} ends in width {sizes[-1]}, which is not a multiple of "
                    f"embedding_dim={D}; make the last size k*{D}"
                )
            projected.append(sizes[-1] // D)
        self.F1, self.F2 = projected
        self.branch1 = MLP(rows * D, interaction_branch1_layer_sizes, activation=activation)
        self.branch2 = MLP(rows * D, interaction_branch2_layer_sizes, activation=activation)
        self.out_features = (D if self.with_dense else 0) + self.F1 * self.F2

    def forward(self, dense: torch.Tensor | None, sparse: torch.Tensor) -> torch.Tensor:
        _check_inputs("ProjectionInteraction", dense, sparse, self.num_sparse_features, self.embedding_dim,
                      self.with_dense)
        B, D = sparse.shape[0], self.embedding_dim
        flat = _combined(dense, sparse).reshape(B, -1)  # (B, (F+1) D), (B, F D) without dense
        y = self.branch1(flat).view(B, self.F1, D)  # (B, F1, D)
        z = self.branch2(flat).view(B, D, self.F2)  # (B, D, F2)
        inter = torch.bmm(y, z).reshape(B, -1)  # (B, F1 F2)
        return inter if dense is None else torch.cat((dense, inter), dim=1)  # (B, [D +] F1 F2)
