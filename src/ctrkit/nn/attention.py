"""Attention layers of the CTR zoo: AFM attentional pooling of pairwise interactions, AutoInt's
multi-head self-attention (interacting layer), a sinusoidal positional encoding and the Transformer
blocks: the post-norm encoder layer (BST, DSIN) and the pre-norm causal block (SASRec) (seed 002 "AFM",
"AutoInt", "Transformer"). Every model's Transformer block lives here."""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor, nn

from ctrkit.errors import LayerConfigError
from ctrkit.nn.afm_pool import fused_afm_pool
from ctrkit.nn.field_attention import fused_self_attention
from ctrkit.nn.field_attention_lanes import lane_attention_stack, lane_self_attention
from ctrkit.nn.fm import check_embeddings, pair_indices

__all__ = [
    "AFMAttention", "CausalTransformerBlock", "MultiHeadSelfAttention", "SelfAttentionStack", "TransformerEncoderLayer",
    "positional_encoding",
]


class AFMAttention(nn.Module):
    """Attentional pooling of pairwise interactions (Xiao et al., "Attentional Factorization
    Machines", IJCAI 2017; seed 002 "AFM").

        p_ij  = v_i ⊙ v_j                                   pairs i < j          (B, P, D)
        a'_ij = h^T ReLU(W p_ij + b),  W ∈ R^{A×D}, h ∈ R^A                        (B, P)
        a_ij  = softmax over the P pairs of a'_ij                                   (B, P)
        pooled = Σ_{i<j} a_ij p_ij                                                 (B, D)
        y     = p^T dropout(pooled)                                                (B, 1)

    Input (B, F, D) -> (B, 1) (``out_features = 1``), or (B, D) with ``use_projection=False``
    (``out_features = D``). Dropout (the paper's dropout on the interaction layer) is applied to
    the pooled vector before the projection. :meth:`pool` returns ``(pooled, a)`` for inspection.
    Options (keyword-only): ``attention_dim`` A (default 16), ``dropout`` (0.0), ``use_projection`` (True),
    ``num_fields`` (None: read F from the input; an int is checked at construction and on every input).
    Needs F >= 2 (at least one pair). Training (gradients on, float32/64, no autocast) runs the pooling as one
    autograd node with its backward written out (:mod:`ctrkit.nn.afm_pool`: no (B, P, D) tensor); evaluation,
    :meth:`pool` and TorchScript run the formula above.
    """

    def __init__(
        self,
        embedding_dim: int,
        *,
        attention_dim: int = 16,
        dropout: float = 0.0,
        use_projection: bool = True,
        num_fields: int | None = None,
    ) -> None:
        super().__init__()
        if num_fields is not None and num_fields < 2:
            raise LayerConfigError(f"AFMAttention: num_fields must be >= 2 to form a pair, got {num_fields}")
        self.num_fields = num_fields
        if attention_dim < 1:
            raise LayerConfigError(f"AFMAttention: attention_dim must be >= 1, got {attention_dim}")
        if not 0.0 <= dropout < 1.0:
            raise LayerConfigError(f"AFMAttention: dropout must be in [0, 1), got {dropout}")
        self.embedding_dim, self.attention_dim = embedding_dim, attention_dim
        self.attention = nn.Linear(embedding_dim, attention_dim)  # W, b
        self.h = nn.Parameter(torch.empty(attention_dim))
        self.dropout = nn.Dropout(dropout)
        self.projection = nn.Parameter(torch.empty(embedding_dim)) if use_projection else None
        self.out_features = 1 if use_projection else embedding_dim
        if num_fields is not None:
            rows, cols = pair_indices(num_fields)
            self.register_buffer("rows", rows, persistent=False)
            self.register_buffer("cols", cols, persistent=False)
        else:
            self.rows, self.cols = None, None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.attention.weight)
        nn.init.zeros_(self.attention.bias)
        nn.init.normal_(self.h, std=self.attention_dim**-0.5)
        if self.projection is not None:
            nn.init.normal_(self.projection, std=self.embedding_dim**-0.5)

    def _check(self, emb: Tensor) -> None:
        check_embeddings("AFMAttention", emb, self.num_fields, self.embedding_dim)
        if emb.shape[1] < 2:
            raise LayerConfigError(
                f"AFMAttention: needs at least 2 fields to form a pair, got input shape {list(emb.shape)}"
            )

    def _fused(self, emb: Tensor) -> bool:
        """Whether the training path applies: training with gradients, float32/64, no autocast."""
        return (self.training and torch.is_grad_enabled() and emb.dtype in (torch.float32, torch.float64)
                and not torch.is_autocast_enabled(emb.device.type))

    @torch.jit.unused
    def _fused_pool(self, emb: Tensor) -> Tensor | None:
        """The pooled vector (B, D) through the one-node training path, or None where it does not apply."""
        if not self._fused(emb):
            return None
        self._check(emb)
        return fused_afm_pool(emb, self.attention.weight, self.attention.bias, self.h)

    def pool(self, emb: Tensor) -> tuple[Tensor, Tensor]:
        """Attention-weighted sum of pairwise products ``(pooled (B, D), weights (B, P))``."""
        self._check(emb)
        b, f, _ = emb.shape
        if self.rows is not None and self.cols is not None:
            rows, cols = self.rows, self.cols  # (P,), (P,) precomputed
        else:  # F known only from the input
            idx = torch.triu_indices(f, f, 1, device=emb.device)
            rows, cols = idx[0], idx[1]
        # index_select, not emb[:, rows]: the same values, and its backward is an index_add_ instead of
        # advanced indexing's slower accumulating index_put_
        prods = emb.index_select(1, rows) * emb.index_select(1, cols)  # (B, P, D)
        scores = torch.relu(self.attention(prods)) @ self.h  # (B, P, A) @ (A,) -> (B, P)
        weights = torch.softmax(scores, dim=1)  # (B, P)
        # Σ_{i<j} a_ij v_i ⊙ v_j = Σ_i v_i ⊙ (A V)_i with A the (F, F) upper-triangular matrix of the a_ij:
        # one small batched matmul instead of a (B, P, D) product and its backward (same sums, another order)
        tri = weights.new_zeros(b, f * f).index_copy(1, rows * f + cols, weights).view(b, f, f)  # (B, F, F)
        pooled = (emb * torch.bmm(tri, emb)).sum(dim=1)  # (B, D)
        return pooled, weights

    def forward(self, emb: Tensor) -> Tensor:
        pooled = self._fused_pool(emb) if not torch.jit.is_scripting() else None  # training: nn/afm_pool.py
        if pooled is None:
            pooled = self.pool(emb)[0]  # (B, D)
        pooled = self.dropout(pooled)
        if self.projection is None:
            return pooled
        return (pooled @ self.projection).unsqueeze(1)  # (B, 1)

    def extra_repr(self) -> str:
        return f"embedding_dim={self.embedding_dim}, attention_dim={self.attention_dim}"


class MultiHeadSelfAttention(nn.Module):
    """Multi-head self-attention over fields — AutoInt's interacting layer (Song et al., "AutoInt:
    Automatic Feature Interaction Learning via Self-Attentive Neural Networks", CIKM 2019).

    For each head h (H heads of size d'), with ``E`` (B, F, D):

        Q^h = E W_Q^h,  K^h = E W_K^h,  V^h = E W_V^h                  W^h ∈ R^{D×d'}
        α^h_{m,k} = softmax_k( <Q^h_m, K^h_k> [/ sqrt(d')] )          over unmasked keys k
        ẽ^h_m = Σ_k α^h_{m,k} V^h_k
        out_m = ReLU( [ẽ^1_m; ...; ẽ^H_m] + E_m W_res )               W_res ∈ R^{D×H·d'}

    Input (B, F, D) -> output (B, F, H·d'), ``out_features = H·d'`` (so layers stack with
    ``embedding_dim = previous out_features``).

    Options (keyword-only): ``num_heads`` (2), ``head_dim`` d' (default D // num_heads),
    ``use_residual`` (True: W_res projection; False: no residual), ``scaled`` (False — AutoInt's
    unscaled dot product; True divides by sqrt(d') as the Transformer), ``use_relu`` (True),
    ``layer_norm`` (False: LayerNorm on the output), ``dropout`` on the attention weights (0.0).
    ``forward(emb, mask)``: optional ``mask`` (B, F) bool, True = a real position. Masked keys get
    no attention; a row whose keys are all masked attends to nothing (output = residual only);
    outputs at masked query positions are computed but meaningless (pool them with the mask).
    """

    def __init__(
        self,
        embedding_dim: int,
        *,
        num_heads: int = 2,
        head_dim: int | None = None,
        use_residual: bool = True,
        scaled: bool = False,
        use_relu: bool = True,
        layer_norm: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if num_heads < 1:
            raise LayerConfigError(f"MultiHeadSelfAttention: num_heads must be >= 1, got {num_heads}")
        if head_dim is None:
            head_dim = embedding_dim // num_heads
        if head_dim < 1:
            raise LayerConfigError(
                f"MultiHeadSelfAttention: head_dim must be >= 1 (got {head_dim}; embedding_dim={embedding_dim}, "
                f"num_heads={num_heads}); pass head_dim explicitly"
            )
        if not 0.0 <= dropout < 1.0:
            raise LayerConfigError(f"MultiHeadSelfAttention: dropout must be in [0, 1), got {dropout}")
        self.embedding_dim, self.num_heads, self.head_dim = embedding_dim, num_heads, head_dim
        self.scaled, self.use_relu = scaled, use_relu
        inner = num_heads * head_dim
        self.w_q = nn.Linear(embedding_dim, inner, bias=False)
        self.w_k = nn.Linear(embedding_dim, inner, bias=False)
        self.w_v = nn.Linear(embedding_dim, inner, bias=False)
        self.w_res = nn.Linear(embedding_dim, inner, bias=False) if use_residual else None
        self.norm = nn.LayerNorm(inner) if layer_norm else None
        self.dropout = nn.Dropout(dropout)
        self.out_features = inner
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (self.w_q, self.w_k, self.w_v, self.w_res):
            if lin is not None:
                nn.init.xavier_uniform_(lin.weight)
        if self.norm is not None:
            self.norm.reset_parameters()

    def attention_weights(self, emb: Tensor, mask: Tensor | None = None) -> Tensor:
        """Attention weights α (B, H, F, F) (query m, key k)."""
        return self._attend(emb, mask)[1]

    def _attend(self, emb: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        check_embeddings("MultiHeadSelfAttention", emb, dim=self.embedding_dim)
        b, f, _ = emb.shape
        h, dh = self.num_heads, self.head_dim
        q = self.w_q(emb).view(b, f, h, dh).transpose(1, 2)  # (B, H, F, d')
        k = self.w_k(emb).view(b, f, h, dh).transpose(1, 2)  # (B, H, F, d')
        v = self.w_v(emb).view(b, f, h, dh).transpose(1, 2)  # (B, H, F, d')
        scores = q @ k.transpose(2, 3)  # (B, H, F, F)
        if self.scaled:
            scores = scores / math.sqrt(dh)
        if mask is not None:
            if mask.dim() != 2 or mask.shape[0] != b or mask.shape[1] != f:
                raise LayerConfigError(
                    f"MultiHeadSelfAttention: mask must have shape (B, F) = ({b}, {f}), got {list(mask.shape)}"
                )
            keep = mask.to(torch.bool)[:, None, None, :]  # (B, 1, 1, F)
            scores = scores.masked_fill(~keep, float("-inf"))
            weights = torch.softmax(scores, dim=3).nan_to_num(0.0)  # all-masked rows -> 0
        else:
            weights = torch.softmax(scores, dim=3)  # (B, H, F, F)
        out = self.dropout(weights) @ v  # (B, H, F, d')
        return out.transpose(1, 2).reshape(b, f, h * dh), weights  # (B, F, H*d')

    def forward(self, emb: Tensor, mask: Tensor | None = None) -> Tensor:
        if not torch.jit.is_scripting():  # noqa: SIM102 - alone, so that TorchScript skips the block
            if mask is None and self._fused(emb):  # training: nn/field_attention_lanes.py, or nn/field_attention.py
                out = self._fused_forward(emb)  # (B, F, H*d')
                return out if self.norm is None else self.norm(out)
        out, _ = self._attend(emb, mask)  # (B, F, H*d')
        if self.w_res is not None:
            out = out + self.w_res(emb)
        if self.use_relu:
            out = torch.relu(out)
        if self.norm is not None:
            out = self.norm(out)
        return out

    def _fused(self, emb: Tensor) -> bool:
        """Whether the training path applies: training with gradients, no attention dropout, float32/64, no autocast."""
        return (self.training and torch.is_grad_enabled() and self.dropout.p == 0.0
                and emb.dtype in (torch.float32, torch.float64) and not torch.is_autocast_enabled(emb.device.type))

    def _fused_forward(self, emb: Tensor) -> Tensor:
        check_embeddings("MultiHeadSelfAttention", emb, dim=self.embedding_dim)
        w, heads, dh, residual, relu = self._fused_args()
        out = lane_self_attention(emb, w, heads, dh, residual=residual, relu=relu)
        if out is None:  # no native kernel here (or not the CPU): the torch-op node
            out = fused_self_attention(emb, w, heads, dh, residual=residual, relu=relu)
        return out

    def _fused_args(self) -> tuple[Tensor, int, int, bool, bool]:
        """(W, H, d', residual, relu) of the fused paths: W = [W_Q (scaled when ``scaled``); W_K; W_V; W_res]."""
        w_q = self.w_q.weight * self.head_dim**-0.5 if self.scaled else self.w_q.weight
        rows = [w_q, self.w_k.weight, self.w_v.weight, *([self.w_res.weight] if self.w_res is not None else [])]
        return torch.cat(rows), self.num_heads, self.head_dim, self.w_res is not None, self.use_relu

    def extra_repr(self) -> str:
        return (
            f"embedding_dim={self.embedding_dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"scaled={self.scaled}"
        )


class SelfAttentionStack(nn.ModuleList):
    """:class:`MultiHeadSelfAttention` layers applied in turn (AutoInt's interacting layers): (B, F, D) -> the last
    layer's (B, F, H·d'), ``out_features`` the last layer's.

    The same as calling each layer in turn. In training, where every layer takes its fused path (no LayerNorm) and the
    native kernel applies, the stack runs in the kernel's lane layout with one layout copy at each end
    (:func:`~ctrkit.nn.field_attention_lanes.lane_attention_stack`) instead of two per layer."""

    @property
    def out_features(self) -> int:
        return self[-1].out_features

    def forward(self, emb: Tensor) -> Tensor:
        layers: list[MultiHeadSelfAttention] = list(self)  # type: ignore[arg-type]
        if (len(layers) > 1 and all(m.norm is None and m._fused(emb) for m in layers)
                and all(a.out_features == b.embedding_dim for a, b in itertools.pairwise(layers))):
            check_embeddings("MultiHeadSelfAttention", emb, dim=layers[0].embedding_dim)
            out = lane_attention_stack(emb, [m._fused_args() for m in layers])
            if out is not None:
                return out
        for m in layers:
            emb = m(emb)
        return emb


def positional_encoding(length: int, dim: int, *, base: float = 10000.0) -> Tensor:
    """Sinusoidal positional encoding (Vaswani et al., "Attention Is All You Need", 2017):

        PE[t, 2i] = sin(t / base^{2i/D}),   PE[t, 2i+1] = cos(t / base^{2i/D})

    Returns (T, D) float32 (odd D: the last column is a sin).
    """
    if length < 0 or dim < 1:
        raise LayerConfigError(f"positional_encoding: need length >= 0 and dim >= 1, got T={length}, D={dim}")
    pos = torch.arange(length, dtype=torch.float32).unsqueeze(1)  # (T, 1)
    freq = torch.exp(-math.log(base) * torch.arange(0, dim, 2, dtype=torch.float32) / dim)  # (ceil(D/2),)
    angles = pos * freq  # (T, ceil(D/2))
    pe = torch.zeros(length, dim)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : dim // 2])
    return pe


class TransformerEncoderLayer(nn.Module):
    """A post-norm Transformer encoder layer (Vaswani et al. 2017) built on
    :class:`MultiHeadSelfAttention` (scaled, no W_res, no ReLU) plus an output projection:

        A = LayerNorm(X + Dropout(MHSA(X) W_O))
        Y = LayerNorm(A + Dropout(W_2 ReLU(W_1 A)))          W_1: D -> ffn_dim, W_2: ffn_dim -> D

    Input (B, T, D) -> (B, T, D), ``out_features = D``; optional ``mask`` (B, T) bool (True = real).
    Options (keyword-only): ``num_heads`` (1; must divide D), ``ffn_dim`` (4·D), ``dropout`` (0.0).
    Add :func:`positional_encoding` (or a learned one) to X before the first layer.
    """

    def __init__(self, embedding_dim: int, *, num_heads: int = 1, ffn_dim: int | None = None, dropout: float = 0.0):
        super().__init__()
        if num_heads < 1 or embedding_dim % num_heads:
            raise LayerConfigError(
                f"TransformerEncoderLayer: num_heads={num_heads} must be >= 1 and divide embedding_dim={embedding_dim}"
            )
        ffn_dim = 4 * embedding_dim if ffn_dim is None else ffn_dim
        self.attn = MultiHeadSelfAttention(
            embedding_dim, num_heads=num_heads, use_residual=False, scaled=True, use_relu=False, dropout=dropout
        )
        self.w_o = nn.Linear(embedding_dim, embedding_dim)
        self.ffn = nn.Sequential(nn.Linear(embedding_dim, ffn_dim), nn.ReLU(), nn.Linear(ffn_dim, embedding_dim))
        self.norm1, self.norm2 = nn.LayerNorm(embedding_dim), nn.LayerNorm(embedding_dim)
        self.dropout = nn.Dropout(dropout)
        self.out_features = embedding_dim
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.attn.reset_parameters()
        for lin in (self.w_o, self.ffn[0], self.ffn[2]):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)
        self.norm1.reset_parameters()
        self.norm2.reset_parameters()

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        a = self.norm1(x + self.dropout(self.w_o(self.attn(x, mask))))  # (B, T, D)
        return self.norm2(a + self.dropout(self.ffn(a)))  # (B, T, D)


class CausalTransformerBlock(nn.Module):
    """A pre-norm Transformer block with causal self-attention (position t attends to 0..t)::

        X = X + Dropout(W_O · Attention(LN(X)))      softmax(Q Kᵀ / sqrt(D/h) + causal mask) V per head
        X = X + Dropout(W_2 · Dropout(ReLU(W_1 · LN(X))))

    (B, T, D) -> (B, T, D), ``out_features = D``. SASRec's block (pre-norm, one fused QKV projection,
    PyTorch's default Linear init); :class:`TransformerEncoderLayer` is the post-norm one of BST / DSIN. Two
    classes, not one with a switch: their parameters (names, shapes, init) differ, and merging them would
    change seeded results and the state-dict keys of saved checkpoints. Dropout acts on activations, not on the (B, h, T, T) attention weights (the
    paper's; measured: dropping the attention weights cost as much as the rest of the forward on CPU).
    """

    def __init__(self, d: int, num_heads: int, ffn_dim: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ffn = nn.Sequential(nn.Linear(d, ffn_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn_dim, d))
        self.dropout = nn.Dropout(dropout)
        self.out_features = d

    def forward(self, x: Tensor) -> Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.num_heads, D // self.num_heads).unbind(2)
        a = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                       is_causal=True)  # (B, h, T, D/h)
        x = x + self.dropout(self.out(a.transpose(1, 2).reshape(B, T, D)))
        return x + self.dropout(self.ffn(self.norm2(x)))  # (B, T, D)
