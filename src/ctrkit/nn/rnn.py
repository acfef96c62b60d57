"""Recurrent layers of DIEN (Zhou et al., "Deep Interest Evolution Network for Click-Through Rate
Prediction", AAAI 2019; seed 002 "DIEN"): the GRU with attention (AIGRU / AGRU / AUGRU) of the interest
evolving layer, and the auxiliary loss of the interest extractor layer.

Masks are (B, T) with True at a real step; rows are right-padded (each row's real steps first, then its
padding), as the behaviour stores write them.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ctrkit.errors import LayerConfigError
from ctrkit.nn.activation import ActivationSpec
from ctrkit.nn.mlp import MLP
from ctrkit.nn.sequence import check_mask

logger = logging.getLogger(__name__)

__all__ = ["GRU_TYPES", "AttentionGRU", "AuxiliaryNet", "dien_auxiliary_loss"]

GRU_TYPES = ("GRU", "AIGRU", "AGRU", "AUGRU")


class AttentionGRU(nn.Module):
    """A GRU over a masked sequence, optionally steered by attention scores a_t (DIEN §4.3).

    Gates in torch.nn.GRU's layout and formulation (rows of W_ih, W_hh in the order r, z, n):

        r   = σ(W_ir x_t + b_ir + W_hr h + b_hr)
        z   = σ(W_iz x_t + b_iz + W_hz h + b_hz)                u = 1 − z  (the paper's update gate)
        h̃   = tanh(W_in x_t + b_in + r ⊙ (W_hn h + b_hn))
        GRU:    h' = (1 − u) ⊙ h + u ⊙ h̃                          (= torch.nn.GRU; att ignored)
        AIGRU:  the GRU on a_t · x_t
        AGRU:   h' = (1 − a_t) · h + a_t · h̃
        AUGRU:  ũ = a_t · u,  h' = (1 − ũ) ⊙ h + ũ ⊙ h̃

    x (B, T, I), mask (B, T) bool (None: all real), att (B, T) (needed by AIGRU / AGRU / AUGRU) ->
    (outputs (B, T, H), final (B, H)). h_0 = 0; a padded step keeps the previous state, so outputs at
    padding repeat the last real state and final is the state at each row's last real step (0 for an
    empty row). GRU / AIGRU run torch's fused GRU kernel (cuDNN on GPU) over all T steps, which is exact
    for right-padded rows; AGRU / AUGRU (and ``fused=False``) compute x_t W_ih for all steps in one GEMM
    and loop over T with one (B, H) x (H, 3H) GEMM per step, exact for any mask. Parameters live in
    ``self.gru`` (a one-layer ``nn.GRU``, batch_first; its init: U(−1/sqrt(H), 1/sqrt(H))).
    """

    def __init__(self, input_size: int, hidden_size: int, *, gru_type: str = "GRU", fused: bool = True) -> None:
        super().__init__()
        if gru_type not in GRU_TYPES:
            raise LayerConfigError(f"AttentionGRU: unknown gru_type={gru_type!r}; valid: {', '.join(GRU_TYPES)}")
        if input_size < 1 or hidden_size < 1:
            raise LayerConfigError(
                f"AttentionGRU: input_size and hidden_size must be >= 1, got {input_size}, {hidden_size}"
            )
        self.input_size, self.hidden_size, self.gru_type = input_size, hidden_size, gru_type
        self.fused = bool(fused)  # GRU / AIGRU: torch's GRU kernel; AGRU / AUGRU: _AttentionGRUFunction
        self.gru = nn.GRU(input_size, hidden_size, batch_first=True)
        self.out_features = hidden_size

    def reset_parameters(self) -> None:
        self.gru.reset_parameters()

    def forward(self, x: Tensor, mask: Tensor | None = None, att: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if x.dim() != 3 or x.shape[2] != self.input_size:
            raise LayerConfigError(
                f"AttentionGRU: x must be (B, T, {self.input_size}), got shape {list(x.shape)}"
            )
        b, t, _ = x.shape
        mask = check_mask("AttentionGRU", mask, [b, t], x.device)
        if self.gru_type != "GRU":
            if att is None or att.shape != (b, t):
                got = None if att is None else list(att.shape)
                raise LayerConfigError(f"AttentionGRU: gru_type={self.gru_type!r} needs att (B, T) = ({b}, {t}), got {got}")
            att = att.to(x.dtype)
            if self.gru_type == "AIGRU":
                x = x * att.unsqueeze(2)  # (B, T, I)
        if t == 0:
            return x.new_zeros(b, 0, self.hidden_size), x.new_zeros(b, self.hidden_size)
        attended = self.gru_type in ("AGRU", "AUGRU")
        if self.fused and attended:
            g = self.gru
            gi = F.linear(x, g.weight_ih_l0, g.bias_ih_l0)  # (B, T, 3H)
            return _AttentionGRUFunction.apply(gi, g.weight_hh_l0, g.bias_hh_l0, att, mask,
                                               self.gru_type == "AUGRU")
        if self.fused:
            return self._fused(x, mask)
        return self._loop(x, mask, att if attended else None)

    def _fused(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        out, _ = self.gru(x)  # (B, T, H): exact up to each row's last real step
        last = (mask.sum(dim=1) - 1).clamp_min(0)  # (B,) index of the last real step (right padding)
        final = out.gather(1, last.view(-1, 1, 1).expand(-1, 1, self.hidden_size)).squeeze(1)  # (B, H)
        final = final * mask.any(dim=1, keepdim=True).to(out.dtype)  # empty row -> 0
        out = torch.where(mask.unsqueeze(2), out, final.unsqueeze(1))  # padded steps hold the final state
        return out, final

    def _loop(self, x: Tensor, mask: Tensor, att: Tensor | None) -> tuple[Tensor, Tensor]:
        g = self.gru
        hs = self.hidden_size
        gi = F.linear(x, g.weight_ih_l0, g.bias_ih_l0)  # (B, T, 3H): every step's input projection at once
        w_hh_t = g.weight_hh_l0.t()  # (H, 3H): the three hidden projections in one GEMM per step
        h = x.new_zeros(x.shape[0], hs)  # (B, H)
        keep = mask.unsqueeze(2)  # (B, T, 1)
        outputs = []
        for step in range(x.shape[1]):
            gh = torch.addmm(g.bias_hh_l0, h, w_hh_t)  # (B, 3H)
            gi_t = gi[:, step]  # (B, 3H)
            rz = torch.sigmoid(gi_t[:, : 2 * hs] + gh[:, : 2 * hs])  # (B, 2H)
            r, z = rz[:, :hs], rz[:, hs:]
            n = torch.tanh(torch.addcmul(gi_t[:, 2 * hs :], r, gh[:, 2 * hs :]))  # (B, H) h̃
            if att is None:
                u = 1.0 - z  # GRU
            elif self.gru_type == "AGRU":
                u = att[:, step : step + 1]  # (B, 1)
            else:
                u = att[:, step : step + 1] * (1.0 - z)  # AUGRU
            h_new = torch.addcmul(h, u, n - h)  # (1 − u) h + u h̃
            h = torch.where(keep[:, step], h_new, h)  # a padded step keeps the state
            outputs.append(h)
        return torch.stack(outputs, dim=1), h  # (B, T, H), (B, H)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, gru_type={self.gru_type}, fused={self.fused}"


class _AttentionGRUFunction(torch.autograd.Function):
    """AGRU / AUGRU over all T steps with a hand-written backward (BPTT) instead of autograd's per-step
    graph: the recurrence is ~10 small ops a step, and recording / replaying them cost more than the math
    (DIEN's training step on Taobao shapes, B=256, T=50, H=32). Same formulas as :meth:`AttentionGRU._loop`
    (tested against it, values and gradients, and by gradcheck). Inputs: gi = x W_ih^T + b_ih (B, T, 3H),
    W_hh (3H, H), b_hh (3H,), att (B, T), mask (B, T) bool; ``update_gate`` True for AUGRU (ũ = a (1 − z)),
    False for AGRU (u = a). Backward, per step from the last, with dh the gradient reaching h_t::

        dh' = m dh,  du = dh' ⊙ (h̃ − h),  dh̃ = dh' ⊙ u
        AUGRU: dz = −a du, da = Σ du ⊙ (1 − z);   AGRU: dz = 0, da = Σ du
        dp_n = dh̃ ⊙ (1 − h̃²),  dp_r = dp_n ⊙ g_n ⊙ r (1 − r),  dp_z = dz ⊙ z (1 − z)
        dgi_t = [dp_r, dp_z, dp_n],  dgh_t = [dp_r, dp_z, dp_n ⊙ r]
        dh_{t-1} = (1 − m) dh + dh' ⊙ (1 − u) + dgh_t W_hh
    and dW_hh = Σ_t dgh_tᵀ h_{t−1}, db_hh = Σ_t dgh_t in one GEMM after the loop.
    """

    @staticmethod
    def forward(ctx, gi: Tensor, w_hh: Tensor, b_hh: Tensor, att: Tensor, mask: Tensor,  # type: ignore[override]
                update_gate: bool) -> tuple[Tensor, Tensor]:
        out, h, rzn, g_n = _loops()[0](gi, w_hh, b_hh, att, mask, update_gate)
        ctx.save_for_backward(w_hh, att, mask, out, rzn, g_n)
        ctx.update_gate = update_gate
        return out, h

    @staticmethod
    def backward(ctx, d_out: Tensor | None, d_final: Tensor | None):  # type: ignore[override]
        w_hh, att, mask, out, rzn, g_n = ctx.saved_tensors
        b, _, hs = out.shape
        dh = d_final.clone() if d_final is not None else out.new_zeros(b, hs)  # final = the state after step T-1
        prev = torch.cat([out.new_zeros(b, 1, hs), out[:, :-1]], 1)  # (B, T, H) h_{t-1}
        d_gi, d_gh, d_att = _loops()[1](d_out, dh, w_hh, att, mask, prev, rzn, g_n, ctx.update_gate)
        d_w = d_gh.reshape(-1, 3 * hs).t() @ prev.reshape(-1, hs)  # (3H, H)
        d_b = d_gh.sum((0, 1))
        return d_gi, d_w, d_b, d_att, None, None


def _forward_loop(gi: Tensor, w_hh: Tensor, b_hh: Tensor, att: Tensor, mask: Tensor,
                  update_gate: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The AGRU / AUGRU recurrence of :class:`_AttentionGRUFunction`: (out (B, T, H), final (B, H), r, z, h̃ of
    every step (B, T, 3H), W_hn h + b_hn of every step (B, T, H))."""
    b, t, h3 = gi.shape
    hs = h3 // 3
    w_t = w_hh.t()
    h = gi.new_zeros(b, hs)
    out = gi.new_empty(b, t, hs)
    rzn = gi.new_empty(b, t, h3)  # r, z, h̃ of every step
    g_n = gi.new_empty(b, t, hs)  # W_hn h + b_hn of every step
    keep = mask.unsqueeze(2)  # (B, T, 1)
    a = att.unsqueeze(2)  # (B, T, 1)
    for step in range(t):
        gh = torch.addmm(b_hh, h, w_t)  # (B, 3H)
        gi_t = gi[:, step]
        rz = torch.sigmoid(gi_t[:, : 2 * hs] + gh[:, : 2 * hs])  # (B, 2H)
        n = torch.tanh(torch.addcmul(gi_t[:, 2 * hs :], rz[:, :hs], gh[:, 2 * hs :]))  # (B, H)
        if update_gate:
            u = a[:, step] * (1.0 - rz[:, hs:])
        else:
            u = a[:, step]
        h = torch.where(keep[:, step], torch.addcmul(h, u, n - h), h)
        out[:, step] = h
        rzn[:, step, : 2 * hs] = rz
        rzn[:, step, 2 * hs :] = n
        g_n[:, step] = gh[:, 2 * hs :]
    return out, h, rzn, g_n


def _backward_loop(d_out: Tensor | None, dh: Tensor, w_hh: Tensor, att: Tensor, mask: Tensor, prev: Tensor,
                   rzn: Tensor, g_n: Tensor, update_gate: bool) -> tuple[Tensor, Tensor, Tensor]:
    """BPTT of :func:`_forward_loop` (formulas: :class:`_AttentionGRUFunction`): (d_gi, d_gh (B, T, 3H), d_att
    (B, T)). ``d_out`` None: no gradient reaches the per-step outputs (DIEN reads only the final state)."""
    b, t, hs = prev.shape
    m_all = mask.unsqueeze(2).to(prev.dtype)  # (B, T, 1)
    a_all = att.unsqueeze(2)
    d_gi = prev.new_empty(b, t, 3 * hs)
    d_gh = prev.new_empty(b, t, 3 * hs)
    d_att = prev.new_empty(b, t)
    for step in range(t - 1, -1, -1):
        if d_out is not None:
            dh = dh + d_out[:, step]
        m, a = m_all[:, step], a_all[:, step]
        r, z, n = rzn[:, step, :hs], rzn[:, step, hs : 2 * hs], rzn[:, step, 2 * hs :]
        dh_new = dh * m
        du = dh_new * (n - prev[:, step])
        if update_gate:
            one_z = 1.0 - z
            u = a * one_z
            d_att[:, step] = (du * one_z).sum(1)
            d_gi[:, step, hs : 2 * hs] = -du * a * z * one_z
        else:
            u = a.expand_as(z)
            d_att[:, step] = du.sum(1)
            d_gi[:, step, hs : 2 * hs] = 0.0
        dp_n = dh_new * u * (1.0 - n * n)
        d_gi[:, step, :hs] = dp_n * g_n[:, step] * r * (1.0 - r)
        d_gi[:, step, 2 * hs :] = dp_n
        d_gh[:, step, : 2 * hs] = d_gi[:, step, : 2 * hs]
        d_gh[:, step, 2 * hs :] = dp_n * r
        dh = dh * (1.0 - m) + dh_new * (1.0 - u) + d_gh[:, step] @ w_hh
    return d_gi, d_gh, d_att


_SCRIPTED: list[Callable[..., Any]] = []


def _loops() -> list[Callable[..., Any]]:
    """The two loops compiled by TorchScript on first use (one interpreter call instead of ~10–35 Python-level
    op dispatches per step: DIEN's AUGRU forward 6.1 -> 4.9 CPU ms on Taobao shapes, values bit-identical);
    the plain Python functions where TorchScript is not available."""
    if not _SCRIPTED:
        try:
            with warnings.catch_warnings():  # torch >= 2.10 marks jit.script deprecated; it still compiles these
                warnings.simplefilter("ignore", DeprecationWarning)
                _SCRIPTED.extend([torch.jit.script(_forward_loop), torch.jit.script(_backward_loop)])
        except Exception as exc:  # noqa: BLE001 - any compiler failure leaves the (identical) Python loops
            logger.warning("AttentionGRU: TorchScript unavailable (%s); running the Python loops", exc)
            _SCRIPTED.extend([_forward_loop, _backward_loop])
    return _SCRIPTED


class AuxiliaryNet(nn.Module):
    """DIEN's auxiliary network: a logit s = MLP([h; e]) -> Linear -> scalar, scoring whether behaviour e
    follows interest state h. Input (..., H + D) -> logits (...). The paper's MLP: ``hidden=(100, 50)``,
    sigmoid activations. :meth:`pair_logits` scores a positive and a negative behaviour against the same
    states, sharing the first layer's h part (W [h; e] = W_h h + W_e e).
    """

    def __init__(
        self,
        in_features: int,
        *,
        hidden: Sequence[int] = (100, 50),
        activation: ActivationSpec = "sigmoid",
    ) -> None:
        super().__init__()
        hidden = [int(h) for h in hidden]
        if in_features < 2 or not hidden or any(h < 1 for h in hidden):
            raise LayerConfigError(
                f"AuxiliaryNet: need in_features >= 2 and hidden widths >= 1 (at least one), got "
                f"in_features={in_features}, hidden={hidden}"
            )
        self.in_features = in_features
        self.mlp = MLP(in_features, hidden, activation=activation)
        self.out = nn.Linear(hidden[-1], 1)
        self.out_features = 1

    def reset_parameters(self) -> None:
        self.mlp.reset_parameters()
        self.out.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.mlp(x)).squeeze(-1)  # (...)

    def pair_logits(self, h: Tensor, pos: Tensor, neg: Tensor) -> tuple[Tensor, Tensor]:
        """(s(h, pos), s(h, neg)) for h (..., H), pos / neg (..., D) with H + D = in_features."""
        hs = h.shape[-1]
        if hs + pos.shape[-1] != self.in_features:
            raise LayerConfigError(
                f"AuxiliaryNet: state width {hs} + behaviour width {pos.shape[-1]} must be in_features="
                f"{self.in_features}"
            )
        first, rest = self.mlp.layers[0], self.mlp.layers[1:]
        w_h, w_e = first.weight[:, :hs], first.weight[:, hs:]
        from_h = F.linear(h, w_h, first.bias)  # (..., W1) shared by both behaviours
        # both behaviours' e part in one GEMM over the (small) stacked inputs; the state part is added by
        # broadcasting, so the wide (2·..., W1) pre-activation is written once (no concatenation of it)
        both = F.linear(torch.cat([pos, neg]), w_e)  # (2·..., W1)
        both = (both.view(2, *pos.shape[:-1], -1) + from_h).flatten(0, 1)  # (2·..., W1)
        s = self.out(rest(both)).squeeze(-1)
        return s[: len(pos)], s[len(pos):]


def dien_auxiliary_loss(h: Tensor, pos: Tensor, neg: Tensor, mask: Tensor, net: nn.Module | None = None) -> Tensor:
    """DIEN's auxiliary loss (paper eq. 6) on the interest extractor's states:

        L_aux = −(1/N) Σ_{b, t: mask[b, t] ∧ mask[b, t+1]} [ log σ(s(h_t, e_{t+1})) + log(1 − σ(s(h_t, ê_{t+1}))) ]

    h (B, T, H) the GRU states, pos (B, T, D) the behaviours e, neg (B, T, D) one sampled negative ê per
    step, mask (B, T); N the number of (t, t+1) pairs of real steps. s = net([h; e]) (a logit, e.g.
    :class:`AuxiliaryNet` (H + D)), or the inner product h · e with ``net=None`` (needs H == D). A batch
    with no pair gives 0 (still connected to the graph). Returns a scalar.
    """
    if h.dim() != 3 or pos.shape != neg.shape or pos.shape[:2] != h.shape[:2] or mask.shape != h.shape[:2]:
        raise LayerConfigError(
            f"dien_auxiliary_loss: need h (B, T, H), pos / neg (B, T, D), mask (B, T) with equal B, T; got "
            f"h {list(h.shape)}, pos {list(pos.shape)}, neg {list(neg.shape)}, mask {list(mask.shape)}"
        )
    if net is None and h.shape[2] != pos.shape[2]:
        raise LayerConfigError(
            f"dien_auxiliary_loss: the inner product needs H == D, got H={h.shape[2]}, D={pos.shape[2]}; "
            "pass net=AuxiliaryNet(H + D)"
        )
    mask = mask.to(torch.bool)
    b, t = mask.shape
    pairs = mask[:, :-1] & mask[:, 1:]  # (B, T−1) real (t, t+1)
    # only the N real pairs are scored (padding would be computed and masked away otherwise): their flat
    # (b·T + t) positions found once, then three row gathers (index_select; backward: index_add)
    rows, steps = pairs.nonzero(as_tuple=True)  # (N,), (N,) in row-major order
    at = rows * t + steps  # (N,) h_t;  at + 1: e_{t+1}
    states = h.reshape(b * t, h.shape[2]).index_select(0, at)  # (N, H)
    e_pos = pos.reshape(b * t, pos.shape[2]).index_select(0, at + 1)  # (N, D)
    e_neg = neg.reshape(b * t, neg.shape[2]).index_select(0, at + 1)  # (N, D)
    if net is None:
        s_pos, s_neg = (states * e_pos).sum(dim=1), (states * e_neg).sum(dim=1)  # (N,)
    elif isinstance(net, AuxiliaryNet):
        s_pos, s_neg = net.pair_logits(states, e_pos, e_neg)
    else:
        s_pos, s_neg = net(torch.cat([states, e_pos], dim=1)), net(torch.cat([states, e_neg], dim=1))
        s_pos, s_neg = s_pos.reshape(-1), s_neg.reshape(-1)
    # −log σ(s) = softplus(−s), −log(1 − σ(s)) = softplus(s)
    per_pair = F.softplus(-s_pos) + F.softplus(s_neg)  # (N,)
    return per_pair.sum() / max(len(per_pair), 1)
