"""Compressed Interaction Network of xDeepFM (Lian et al., "xDeepFM: Combining Explicit and Implicit
Feature Interactions for Recommender Systems", KDD 2018; seed 002 "XDeepFM / CIN 结构")."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ctrkit.nn.fm import LayerConfigError, check_embeddings

__all__ = ["CIN"]

_ACTIVATIONS = {"identity": nn.Identity, "relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}


def _activation(layer: str, spec: str | nn.Module) -> nn.Module:
    if isinstance(spec, nn.Module):
        return spec
    if spec not in _ACTIVATIONS:
        raise LayerConfigError(
            f"{layer}: unknown activation={spec!r}; valid: {', '.join(_ACTIVATIONS)} (or an nn.Module)"
        )
    return _ACTIVATIONS[spec]()


class _CINLayer(nn.Module):
    """One CIN layer before the activation: ``X^k_h = Σ_i Σ_j W[h, i, j] (X^{k-1}_i ⊙ X^0_j) [+ b_h]``."""

    def __init__(self, prev: int, num_fields: int, size: int, *, keep: int, bias: bool) -> None:
        super().__init__()
        self.size, self.keep, self.out_size = size, keep, (size - keep if keep < size else size)
        self.weight = nn.Parameter(torch.empty(size, prev, num_fields))  # (H_k, H_{k-1}, F)
        if bias:
            self.bias = nn.Parameter(torch.zeros(size))
        else:
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.weight.shape[1] * self.weight.shape[2])  # as a 1x1 Conv1d
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, h: Tensor, x0: Tensor) -> Tensor:
        b, _, d = x0.shape
        # Hadamard maps laid out (B*D, H_{k-1}*F) so the 1x1 convolution is ONE large GEMM with the
        # (H_{k-1}F, H_k) kernel (measured 1.3x faster fwd+bwd than B small (H_k, H_{k-1}F) @ (H_{k-1}F, D))
        z = (h.transpose(1, 2).unsqueeze(3) * x0.transpose(1, 2).unsqueeze(2)).reshape(b * d, -1)  # (B*D, H_{k-1}F)
        x = (z @ self.weight.reshape(self.size, -1).t()).view(b, d, self.size).transpose(1, 2)  # (B, H_k, D)
        if self.bias is not None:
            x = x + self.bias.unsqueeze(1)
        return x


class CIN(nn.Module):
    """Compressed Interaction Network (vector-wise explicit interactions of bounded order).

    ``X^0 = E`` (B, F, D) with ``H_0 = F`` rows. Layer ``k`` (``H_k = layer_sizes[k-1]`` feature maps):

        X^k_{h,*} = σ( Σ_{i=1}^{H_{k-1}} Σ_{j=1}^{F} W^{k,h}_{ij} (X^{k-1}_{i,*} ⊙ X^0_{j,*}) [+ b^k_h] )

    computed as one matmul per layer (a 1×1 convolution over the D positions of the
    (H_{k-1}·F) Hadamard maps). Each layer's maps are sum-pooled over D, ``p^k_h = Σ_d X^k_{h,d}``,
    and all layers' pooled vectors are concatenated: output ``p^+ = [p^1, ..., p^L]``.

    ``split_half`` (as xDeepFM's released code): every layer but the last sends half of its maps to
    the output and keeps the other half as ``X^k`` for the next layer, so those sizes must be even.
    Output (B, out_features) with ``out_features = Σ_{k<L} H_k/2 + H_L`` (split_half) or ``Σ_k H_k``.

    Options (keyword-only): ``layer_sizes`` (default (128, 128)), ``split_half`` (True),
    ``activation`` 'identity' (the paper's formula, default) | 'relu' | 'sigmoid' | 'tanh' | a module,
    ``bias`` (False, as the formula; True adds ``b^k_h``).
    """

    def __init__(
        self,
        num_fields: int,
        embedding_dim: int,
        *,
        layer_sizes: Sequence[int] = (128, 128),
        split_half: bool = True,
        activation: str | nn.Module = "identity",
        bias: bool = False,
    ) -> None:
        super().__init__()
        layer_sizes = tuple(int(s) for s in layer_sizes)
        if num_fields < 1:
            raise LayerConfigError(f"CIN: num_fields must be >= 1, got {num_fields}")
        if not layer_sizes or any(s < 1 for s in layer_sizes):
            raise LayerConfigError(f"CIN: layer_sizes must be a non-empty list of positive ints, got {layer_sizes}")
        if split_half and any(s % 2 for s in layer_sizes[:-1]):
            raise LayerConfigError(
                f"CIN: with split_half=True every layer size but the last must be even, got {layer_sizes}; "
                "use even sizes or split_half=False"
            )
        self.num_fields, self.embedding_dim = num_fields, embedding_dim
        self.layer_sizes, self.split_half = layer_sizes, split_half
        self.activation = _activation("CIN", activation)

        self.layers = nn.ModuleList()
        prev = num_fields
        for k, size in enumerate(layer_sizes):
            split = split_half and k < len(layer_sizes) - 1
            self.layers.append(_CINLayer(prev, num_fields, size, keep=size // 2 if split else size, bias=bias))
            prev = self.layers[-1].keep
        self.out_features = sum(layer.out_size for layer in self.layers)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for layer in self.layers:
            layer.reset_parameters()

    def forward(self, emb: Tensor) -> Tensor:
        check_embeddings("CIN", emb, self.num_fields, self.embedding_dim)
        h = emb  # (B, H_0 = F, D)
        pooled: list[Tensor] = []
        for layer in self.layers:
            x = self.activation(layer(h, emb))  # (B, H_k, D)
            if layer.keep < layer.size:  # split_half and not the last layer
                h, direct = x[:, : layer.keep], x[:, layer.keep :]  # (B, H_k/2, D) each
            else:
                h, direct = x, x
            pooled.append(direct.sum(dim=2))  # (B, out_k)
        return torch.cat(pooled, dim=1)  # (B, out_features)

    def extra_repr(self) -> str:
        return (
            f"num_fields={self.num_fields}, embedding_dim={self.embedding_dim}, layer_sizes={self.layer_sizes}, "
            f"split_half={self.split_half}, out_features={self.out_features}"
        )
