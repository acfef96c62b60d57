"""Behaviour-sequence layers of DIN (Zhou et al., "Deep Interest Network for Click-Through Rate Prediction",
KDD 2018; seed 002 "DIN"): the local activation unit (target attention), masked pooling and the
mini-batch-aware L2 regulariser. DIN's Dice activation lives with the activations
(:mod:`ctrkit.nn.activation`) and is re-exported here.

Masks are (B, T) with True (or 1) at a real behaviour and False at padding; a row with no real position
(an empty history) pools to zeros, never NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ctrkit.errors import LayerConfigError
from ctrkit.nn.activation import ActivationSpec, Dice, make_activation
from ctrkit.nn.mlp import MLP

__all__ = ["Dice", "TargetAttention", "check_mask", "masked_mean", "masked_softmax", "masked_sum", "mba_l2"]


def check_mask(layer: str, mask: Tensor | None, shape: list[int], device: torch.device) -> Tensor:
    """``mask`` as bool, checked to have ``shape`` (a LayerConfigError naming ``layer`` otherwise); None: all
    real. TorchScript-able (the session layers are scripted)."""
    if mask is None:
        return torch.ones(shape, dtype=torch.bool, device=device)
    if list(mask.shape) != list(shape):
        raise LayerConfigError(f"{layer}: mask must have shape {list(shape)}, got {list(mask.shape)}")
    return mask.to(torch.bool)


def masked_softmax(scores: Tensor, mask: Tensor | None) -> Tensor:
    """softmax over the last dim restricted to ``mask`` (True = real); masked entries get weight 0 and a row
    with no real entry gets all-zero weights (forward and backward stay finite)."""
    if mask is None:
        return torch.softmax(scores, dim=-1)
    scores = scores.masked_fill(~mask, float("-inf"))
    scores = scores.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # empty row: uniform, zeroed below
    return torch.softmax(scores, dim=-1) * mask


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    """Σ_t mask_t · x_t: (B, T, D), mask (B, T) -> (B, D). Padding positions get a zero gradient
    (their values must be finite)."""
    if x.dim() != 3:
        raise LayerConfigError(f"masked_sum: x must be (B, T, D), got shape {list(x.shape)}")
    m = check_mask("masked_sum", mask, x.shape[:2], x.device).to(x.dtype)  # (B, T)
    return torch.bmm(m.unsqueeze(1), x).squeeze(1)  # (B, 1, T) @ (B, T, D) -> (B, D)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Σ_t mask_t · x_t / Σ_t mask_t: (B, T, D), mask (B, T) -> (B, D); a row without a real position -> 0."""
    total = masked_sum(x, mask)  # (B, D)
    count = mask.to(x.dtype).sum(dim=1, keepdim=True).clamp_min(1.0)  # (B, 1)
    return total / count


def mba_l2(weight: Tensor | Callable[[Tensor], Tensor], ids: Tensor, counts: Tensor | None, lam: float) -> Tensor:
    """DIN's mini-batch-aware L2 (paper eq. 4) on an embedding table ``weight`` (R, D):

        lam · Σ_{j ∈ unique(ids), j ≠ 0} ||w_j||² / n_j

    ``ids`` (any shape, int64) are the batch's ids of this table (0 = padding, skipped), ``counts`` (R,) the
    occurrences n_j of each id in the training data (a count of 0 counts as 1; None: every n_j = 1).
    ``weight`` may also be a lookup ``ids -> rows (n, D)`` (an embedding collection's ``lookup`` of one
    table, whatever its backend). Returns a scalar with the graph to the table (only the rows present get
    a gradient).
    """
    if isinstance(weight, Tensor):
        if weight.dim() != 2:
            raise LayerConfigError(f"mba_l2: weight must be (R, D), got shape {list(weight.shape)}")
        if counts is not None and (counts.dim() != 1 or counts.shape[0] != weight.shape[0]):
            raise LayerConfigError(
                f"mba_l2: counts must be (R,) = ({weight.shape[0]},), got shape {list(counts.shape)}"
            )
    present = torch.unique(ids.reshape(-1))  # (U,) sorted
    present = present[present != 0]
    rows = weight.index_select(0, present) if isinstance(weight, Tensor) else weight(present)  # (U, D)
    sq = rows.pow(2).sum(dim=1)  # (U,) ||w_j||²
    if counts is not None:
        sq = sq / counts.index_select(0, present).to(sq.dtype).clamp_min(1.0)
    return lam * sq.sum()


class TargetAttention(nn.Module):
    """DIN's local activation unit: attention of a target (query) over a behaviour sequence (keys).

        a_t = Linear( MLP( [q, k_t, q − k_t, q ⊙ k_t] ) )          scalar score of behaviour t   (B, T)
        w_t = a_t · mask_t                          normalize=False (the paper: weights not normalised)
        w   = softmax over the real t of a_t        normalize=True (zeros for a row with no real t)
        pooled = Σ_t w_t k_t                                                                      (B, D)

    q (B, D), k (B, T, D), mask (B, T) bool (None: all real). ``key_dim`` must equal ``query_dim``.
    ``forward`` returns pooled (``out_features = D``), or ``(pooled, w)`` with ``return_scores=True``;
    :meth:`scores` returns w (B, T). The MLP (``hidden`` widths, each followed by ``activation``; "dice":
    :class:`Dice`) is applied to the real positions only, so padding neither enters Dice's batch
    statistics nor receives a gradient; its first Linear W = [W_q, W_k, W_d, W_p] (the layout of the
    concatenated input, see ``first``) is evaluated as (W_q + W_d) q + (W_k − W_d) k_t + W_p (q ⊙ k_t),
    without building the (B, T, 4D) input. Init: PyTorch's Linear init, Dice's α = 0.
    """

    def __init__(
        self,
        query_dim: int,
        key_dim: int | None = None,
        *,
        hidden: Sequence[int] = (80, 40),
        activation: ActivationSpec = "dice",
        normalize: bool = False,
        return_scores: bool = False,
    ) -> None:
        super().__init__()
        key_dim = query_dim if key_dim is None else key_dim
        if query_dim < 1 or key_dim != query_dim:
            raise LayerConfigError(
                f"TargetAttention: query_dim and key_dim must be equal and >= 1, got query_dim={query_dim}, "
                f"key_dim={key_dim} (project the target or the behaviours to one width first)"
            )
        hidden = [int(h) for h in hidden]
        if any(h < 1 for h in hidden):
            raise LayerConfigError(f"TargetAttention: hidden widths must be >= 1, got hidden={hidden}")
        self.dim, self.hidden = query_dim, tuple(hidden)
        self.normalize, self.return_scores = normalize, return_scores
        width = hidden[0] if hidden else 1
        self.first = nn.Linear(4 * query_dim, width)  # over [q, k, q − k, q ⊙ k]
        self.first_activation = (
            make_activation(activation, layer="TargetAttention", num_features=width) if hidden else None
        )
        self.mlp = MLP(width, hidden[1:], activation=activation) if hidden else None
        self.out = nn.Linear(hidden[-1], 1) if hidden else None
        self.out_features = key_dim
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in (self.first, self.first_activation, self.mlp, self.out):
            if m is not None and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def _check(self, q: Tensor, k: Tensor, mask: Tensor | None) -> Tensor:
        if k.dim() != 3 or k.shape[2] != self.dim or q.shape != (k.shape[0], self.dim):
            raise LayerConfigError(
                f"TargetAttention: need q (B, {self.dim}) and k (B, T, {self.dim}), got q {list(q.shape)}, "
                f"k {list(k.shape)}"
            )
        return check_mask("TargetAttention", mask, k.shape[:2], k.device)

    def logits(self, q: Tensor, k: Tensor, mask: Tensor | None = None) -> Tensor:
        """The unit's raw scores a_t (B, T); 0 at padding."""
        mask = self._check(q, k, mask)
        b, t, d = k.shape
        w = self.first.weight  # (W1, 4D) = [W_q, W_k, W_d, W_p]
        w_q, w_k, w_d, w_p = w[:, :d], w[:, d : 2 * d], w[:, 2 * d : 3 * d], w[:, 3 * d :]
        if torch.compiler.is_exporting():  # every position, padding zeroed after: shapes known before the mask
            return self._logits_dense(q, k, mask, w_q + w_d, w_k - w_d, w_p)
        flat = mask.reshape(-1).nonzero().squeeze(1)  # (n,) real positions of the (B·T) grid, row-major
        if flat.numel() == 0:
            return k.new_zeros(b, t)
        rows = torch.div(flat, t, rounding_mode="floor")  # (n,)
        k_real = k.reshape(b * t, d).index_select(0, flat)  # (n, D)
        q_real = q.index_select(0, rows)  # (n, D)
        per_row = F.linear(q, w_q + w_d, self.first.bias)  # (B, W1): once per row, not per behaviour
        h = torch.addmm(per_row.index_select(0, rows), k_real, (w_k - w_d).t())  # (n, W1)
        h = torch.addmm(h, q_real * k_real, w_p.t())  # (n, W1)
        if self.first_activation is not None and self.mlp is not None and self.out is not None:
            h = self.out(self.mlp(self.first_activation(h)))  # (n, 1)
        a = k.new_zeros(b * t).index_copy(0, flat, h.squeeze(1).to(k.dtype))  # (B·T,)
        return a.view(b, t)

    def _logits_dense(self, q: Tensor, k: Tensor, mask: Tensor, w_qd: Tensor, w_kd: Tensor, w_p: Tensor) -> Tensor:
        """:meth:`logits` computed at every (B, T) position, padding zeroed (for torch.export; eval mode, where
        Dice normalises each position on its own)."""
        b, t = k.shape[:2]
        per_row = F.linear(q, w_qd, self.first.bias)  # (B, W1)
        h = per_row.unsqueeze(1) + F.linear(k, w_kd) + F.linear(q.unsqueeze(1) * k, w_p)  # (B, T, W1)
        h = h.reshape(b * t, -1)  # (B·T, W1)
        if self.first_activation is not None and self.mlp is not None and self.out is not None:
            h = self.out(self.mlp(self.first_activation(h)))  # (B·T, 1)
        a = h.reshape(b, t).to(k.dtype)  # (B, T)
        return torch.where(mask, a, torch.zeros_like(a))

    def scores(self, q: Tensor, k: Tensor, mask: Tensor | None = None) -> Tensor:
        """The pooling weights w (B, T): a_t · mask_t, or the masked softmax with ``normalize=True``."""
        a = self.logits(q, k, mask)  # (B, T), 0 at padding
        if not self.normalize:
            return a
        return masked_softmax(a, check_mask("TargetAttention", mask, k.shape[:2], k.device))

    def forward(self, q: Tensor, k: Tensor, mask: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        w = self.scores(q, k, mask)  # (B, T)
        pooled = torch.bmm(w.unsqueeze(1), k).squeeze(1)  # (B, 1, T) @ (B, T, D) -> (B, D)
        return (pooled, w) if self.return_scores else pooled

    def extra_repr(self) -> str:
        return f"dim={self.dim}, hidden={self.hidden}, normalize={self.normalize}"
