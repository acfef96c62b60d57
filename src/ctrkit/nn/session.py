"""Session layers of DSIN (Feng et al., "Deep Session Interest Network for Click-Through Rate
Prediction", IJCAI 2019; seed 002 "DSIN" and "BILSTM"): bias encoding, the session interest
extractor (one Transformer layer shared by the K sessions), the Bi-LSTM session interest
interaction layer and the bilinear session interest activation.

Shapes: B batch, K sessions, T behaviours per session, D embedding dim, H hidden size. Masks are
bool, True = a real session / behaviour. A session with no real behaviour is an empty session; a
row with no real session gives zeros (never NaN) from every layer here.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ctrkit.errors import LayerConfigError
from ctrkit.nn.attention import TransformerEncoderLayer
from ctrkit.nn.sequence import check_mask, masked_mean, masked_softmax

__all__ = ["BiLSTM", "BiasEncoding", "SessionActivation", "SessionInterestExtractor"]

_MERGE_MODES = ("ave", "sum", "concat", "mul", "fw", "bw")


def _gather_steps(x: Tensor, order: Tensor) -> Tensor:
    """x (B, K, D) with its steps permuted per row: out[b, j] = x[b, order[b, j]]."""
    return x.gather(1, order.unsqueeze(2).expand(-1, -1, x.shape[2]))


def _inverse(order: Tensor) -> Tensor:
    """The inverse of per-row permutations (B, K): out[b, order[b, j]] = j (argsort of ``order``, by a scatter)."""
    steps = torch.arange(order.shape[1], device=order.device).unsqueeze(0).expand_as(order)  # (B, K)
    return torch.empty_like(order).scatter_(1, order, steps)


def _real_first(mask: Tensor) -> Tensor:
    """order (B, K): each row's real steps in order, then its padded ones (a stable argsort of ``~mask``, computed
    with cumsums and a scatter, as sorting does not export to ONNX)."""
    real = mask.to(torch.int64)  # (B, K)
    place = torch.where(mask, real.cumsum(1) - 1, real.sum(1, keepdim=True) + (1 - real).cumsum(1) - 1)  # (B, K)
    return _inverse(place)


class BiasEncoding(nn.Module):
    """DSIN's bias encoding: one learned bias per session, per position and per channel,

        BE_(k,t,c) = w^K_k + w^T_t + w^C_c,     w^K ∈ R^K, w^T ∈ R^T, w^C ∈ R^D
        out = X + BE                                                    (B, K, T, D)

    Input (B, K, T, D) -> (B, K, T, D) (``out_features = D``). Init as DeepCTR's: truncated normal, std 1e-4.
    """

    def __init__(self, num_sessions: int, session_len: int, dim: int) -> None:
        super().__init__()
        for name, value in (("num_sessions", num_sessions), ("session_len", session_len), ("dim", dim)):
            if value < 1:
                raise LayerConfigError(f"BiasEncoding: {name} must be >= 1, got {value}")
        self.num_sessions, self.session_len, self.dim = num_sessions, session_len, dim
        self.session_bias = nn.Parameter(torch.empty(num_sessions))  # w^K
        self.position_bias = nn.Parameter(torch.empty(session_len))  # w^T
        self.channel_bias = nn.Parameter(torch.empty(dim))  # w^C
        self.out_features = dim
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in (self.session_bias, self.position_bias, self.channel_bias):
            nn.init.trunc_normal_(p, std=1e-4, a=-2e-4, b=2e-4)

    def encoding(self) -> Tensor:
        """BE (K, T, D)."""
        return (
            self.session_bias[:, None, None]
            + self.position_bias[None, :, None]
            + self.channel_bias[None, None, :]
        )

    def forward(self, x: Tensor) -> Tensor:
        expected = [self.num_sessions, self.session_len, self.dim]
        if x.dim() != 4 or list(x.shape[1:]) != expected:
            raise LayerConfigError(
                f"BiasEncoding: input must have shape (B, num_sessions, session_len, dim) = (B, {expected[0]}, "
                f"{expected[1]}, {expected[2]}), got {list(x.shape)}"
            )
        return x + self.encoding()  # (B, K, T, D)

    def extra_repr(self) -> str:
        return f"num_sessions={self.num_sessions}, session_len={self.session_len}, dim={self.dim}"


class SessionInterestExtractor(nn.Module):
    """DSIN's session interest extractor: one :class:`TransformerEncoderLayer` (multi-head
    self-attention + FFN) shared by the K sessions, then the average over each session's real
    behaviours,

        I_k = mean_{t: mask[k, t]} Transformer(Q_k)_t                  Q_k (T, D) -> I_k (D,)

    The B·K sessions run as one (B·K, T, D) batch. Input ``x`` (B, K, T, D) (add :class:`BiasEncoding`
    first) and ``mask`` (B, K, T) -> (B, K, D) (``out_features = D``); an empty session gives I_k = 0.
    The session mask for the next layers is ``mask.any(dim=2)`` (B, K).
    Options (keyword-only): ``num_heads`` (1; must divide D), ``ffn_dim`` (4·D), ``dropout`` (0.0).
    """

    def __init__(
        self, dim: int, *, num_heads: int = 1, ffn_dim: int | None = None, dropout: float = 0.0
    ) -> None:
        super().__init__()
        if dim < 1:
            raise LayerConfigError(f"SessionInterestExtractor: dim must be >= 1, got {dim}")
        if not 0.0 <= dropout < 1.0:
            raise LayerConfigError(f"SessionInterestExtractor: dropout must be in [0, 1), got {dropout}")
        self.dim = dim
        self.encoder = TransformerEncoderLayer(dim, num_heads=num_heads, ffn_dim=ffn_dim, dropout=dropout)
        self.out_features = dim
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.encoder.reset_parameters()

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[3] != self.dim:
            raise LayerConfigError(
                f"SessionInterestExtractor: input must have shape (B, K, T, dim={self.dim}), got {list(x.shape)}"
            )
        b, k, t, d = x.shape
        flat_mask = check_mask("SessionInterestExtractor", mask, [b, k, t], x.device).reshape(b * k, t)  # (B*K, T)
        h = self.encoder(x.reshape(b * k, t, d), flat_mask)  # (B*K, T, D)
        return masked_mean(h, flat_mask).view(b, k, d)  # (B, K, D), 0 for an empty session

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class BiLSTM(nn.Module):
    """The seed's Bi-LSTM (DSIN's session interest interaction layer): a stack of forward LSTMs and a
    separate stack of backward LSTMs, residual connections on the last ``res_layers`` layers of each
    stack, the two directions merged at the end,

        f^0 = b^0 = X
        f^l = LSTM_fw^l(drop(f^{l-1})) [+ f^{l-1}],  b^l = rev(LSTM_bw^l(rev(drop(b^{l-1})))) [+ b^{l-1}]
        out = merge(f^L, b^L):  ave (f+b)/2 | sum f+b | mul f⊙b | concat [f; b] | fw f | bw b

    (the residual on layer l when l > L − res_layers). Each row runs over its real steps only, in
    order: ``rev`` reverses a row's real steps among themselves, and padded steps (anywhere in the
    row, usually after the real ones) neither feed the recurrence nor get an output (0 there).
    Input (B, K, D_in), mask (B, K) (None: all real) -> (B, K, H), or (B, K, 2H) for concat
    (``out_features``). Dropout is on each layer's input (Keras ``LSTM(dropout=)`` as in the seed).
    Init as the seed's Keras LSTM: Glorot-uniform input weights, orthogonal recurrent weights, all
    gate biases 1. A residual on the first layer needs ``input_size == hidden_size``.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        layers: int = 1,
        res_layers: int = 0,
        dropout: float = 0.0,
        merge_mode: str = "ave",
    ) -> None:
        super().__init__()
        if input_size < 1 or hidden_size < 1:
            raise LayerConfigError(
                f"BiLSTM: input_size and hidden_size must be >= 1, got {input_size}, {hidden_size}"
            )
        if layers < 1:
            raise LayerConfigError(f"BiLSTM: layers must be >= 1, got {layers}")
        if not 0 <= res_layers <= layers:
            raise LayerConfigError(f"BiLSTM: res_layers must be in [0, layers={layers}], got {res_layers}")
        if res_layers == layers and input_size != hidden_size:
            raise LayerConfigError(
                f"BiLSTM: res_layers={res_layers} puts a residual on the first layer, which needs "
                f"input_size == hidden_size (got {input_size} and {hidden_size}); use res_layers <= {layers - 1}"
            )
        if not 0.0 <= dropout < 1.0:
            raise LayerConfigError(f"BiLSTM: dropout must be in [0, 1), got {dropout}")
        if merge_mode not in _MERGE_MODES:
            raise LayerConfigError(
                f"BiLSTM: unknown merge_mode={merge_mode!r}; valid: {', '.join(_MERGE_MODES)}"
            )
        self.input_size, self.hidden_size, self.merge_mode = input_size, hidden_size, merge_mode
        self.layers, self.res_layers = layers, res_layers
        sizes = [input_size] + [hidden_size] * (layers - 1)
        # the stack a merge mode does not read is not built (fw: no backward stack, bw: no forward one)
        self.fw = nn.ModuleList(
            [nn.LSTM(i, hidden_size, batch_first=True) for i in sizes if merge_mode != "bw"]
        )
        self.bw = nn.ModuleList(
            [nn.LSTM(i, hidden_size, batch_first=True) for i in sizes if merge_mode != "fw"]
        )
        self.dropout = nn.Dropout(dropout)
        self.out_features = 2 * hidden_size if merge_mode == "concat" else hidden_size
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lstm in list(self.fw) + list(self.bw):
            nn.init.xavier_uniform_(lstm.weight_ih_l0)
            nn.init.orthogonal_(lstm.weight_hh_l0)
            nn.init.ones_(lstm.bias_ih_l0)  # b_ih + b_hh = 1 on every gate, as Keras bias_initializer='ones'
            nn.init.zeros_(lstm.bias_hh_l0)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if x.dim() != 3 or x.shape[2] != self.input_size:
            raise LayerConfigError(
                f"BiLSTM: input must have shape (B, K, input_size={self.input_size}), got {list(x.shape)}"
            )
        b, k, _ = x.shape
        mask = check_mask("BiLSTM", mask, [b, k], x.device)
        # order_fw[b] = the real positions of row b in order, then its padded ones; order_bw reverses the real part
        order_fw = _real_first(mask)  # (B, K)
        steps = torch.arange(k, device=x.device).unsqueeze(0)  # (1, K)
        lengths = mask.sum(dim=1, keepdim=True)  # (B, 1)
        order_bw = order_fw.gather(1, torch.where(steps < lengths, lengths - 1 - steps, steps))  # (B, K)
        first_res = self.layers - self.res_layers
        out_fw, out_bw = x.new_zeros(0), x.new_zeros(0)
        if self.merge_mode != "bw":
            h = _gather_steps(x, order_fw)  # (B, K, D_in), real steps first
            for i, lstm in enumerate(self.fw):
                y = lstm(self.dropout(h))[0]  # (B, K, H)
                h = y + h if i >= first_res else y
            out_fw = _gather_steps(h, _inverse(order_fw))  # (B, K, H) back in place
        if self.merge_mode != "fw":
            h = _gather_steps(x, order_bw)  # (B, K, D_in), real steps last to first
            for i, lstm in enumerate(self.bw):
                y = lstm(self.dropout(h))[0]  # (B, K, H)
                h = y + h if i >= first_res else y
            out_bw = _gather_steps(h, _inverse(order_bw))  # (B, K, H) back in place
        if self.merge_mode == "fw":
            out = out_fw
        elif self.merge_mode == "bw":
            out = out_bw
        elif self.merge_mode == "concat":
            out = torch.cat([out_fw, out_bw], dim=2)  # (B, K, 2H)
        elif self.merge_mode == "sum":
            out = out_fw + out_bw
        elif self.merge_mode == "mul":
            out = out_fw * out_bw
        else:  # ave
            out = (out_fw + out_bw) / 2
        return out * mask.unsqueeze(2).to(out.dtype)  # (B, K, H or 2H), 0 on padded steps

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, layers={self.layers}, "
            f"res_layers={self.res_layers}, merge_mode={self.merge_mode!r}"
        )


class SessionActivation(nn.Module):
    """DSIN's session interest activation: bilinear attention of the target item over session
    interests, softmax over the real sessions, weighted sum,

        a_k = softmax_k( I_k W x ),   W ∈ R^{D_k×D_q}                over k with mask[k]   (B, K)
        U   = Σ_k a_k I_k                                                                 (B, D_k)

    used twice in DSIN: over the extractor outputs I (W^I) and over the Bi-LSTM outputs H (W^H),
    with the target item's embedding X^I as ``query`` (B, D_q). ``keys`` (B, K, D_k), ``mask`` (B, K)
    (None: all real) -> (B, D_k) (``out_features = D_k``); a row with no real session gives 0.
    :meth:`scores` returns the weights a (B, K).
    """

    def __init__(self, query_dim: int, key_dim: int | None = None) -> None:
        super().__init__()
        key_dim = query_dim if key_dim is None else key_dim
        if query_dim < 1 or key_dim < 1:
            raise LayerConfigError(
                f"SessionActivation: query_dim and key_dim must be >= 1, got {query_dim}, {key_dim}"
            )
        self.query_dim, self.key_dim = query_dim, key_dim
        self.weight = nn.Parameter(torch.empty(key_dim, query_dim))  # W
        self.out_features = key_dim
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.weight)

    def scores(self, query: Tensor, keys: Tensor, mask: Tensor | None = None) -> Tensor:
        """Attention weights a (B, K); 0 on masked sessions."""
        if query.dim() != 2 or query.shape[1] != self.query_dim:
            raise LayerConfigError(
                f"SessionActivation: query must have shape (B, query_dim={self.query_dim}), got {list(query.shape)}"
            )
        if keys.dim() != 3 or keys.shape[0] != query.shape[0] or keys.shape[2] != self.key_dim:
            raise LayerConfigError(
                f"SessionActivation: keys must have shape (B={query.shape[0]}, K, key_dim={self.key_dim}), "
                f"got {list(keys.shape)}"
            )
        if mask is not None:
            mask = check_mask("SessionActivation", mask, keys.shape[:2], keys.device)
        projected = query @ self.weight.T  # (B, D_k) = W x
        logits = (keys @ projected.unsqueeze(2)).squeeze(2)  # (B, K) = I_k W x
        return masked_softmax(logits, mask)  # (B, K)

    def forward(self, query: Tensor, keys: Tensor, mask: Tensor | None = None) -> Tensor:
        weights = self.scores(query, keys, mask)  # (B, K)
        return (weights.unsqueeze(1) @ keys).squeeze(1)  # (B, D_k)

    def extra_repr(self) -> str:
        return f"query_dim={self.query_dim}, key_dim={self.key_dim}"
