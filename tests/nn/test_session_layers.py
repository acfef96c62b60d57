"""DSIN session layers checked against naive per-row / per-session loop references (float64)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from ctrkit.errors import LayerConfigError
from ctrkit.nn.session import BiasEncoding, BiLSTM, SessionActivation, SessionInterestExtractor

B, K, T, D, H = 4, 5, 3, 4, 6


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def session_mask() -> torch.Tensor:
    """(B, K, T): full, partial and empty sessions; row 2 has no session at all; row 3 has a gap."""
    m = torch.zeros(B, K, T, dtype=torch.bool)
    m[0, :3] = True
    m[0, 2, 1:] = False  # a 1-behaviour session
    m[1, :, :2] = True
    m[3, 0] = True
    m[3, 2, :2] = True  # session 1 empty between two real ones
    return m


def row_mask() -> torch.Tensor:
    """(B, K): left-aligned rows of 3 and 5 sessions, an empty row, a row with a gap at 1."""
    return session_mask().any(dim=2)


# ---------------------------------------------------------------- bias encoding
def test_bias_encoding_equals_formula() -> None:
    layer = BiasEncoding(K, T, D).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
    x = torch.randn(B, K, T, D, dtype=torch.float64)
    ref = x.clone()
    for k in range(K):
        for t in range(T):
            for c in range(D):
                ref[:, k, t, c] += layer.session_bias[k] + layer.position_bias[t] + layer.channel_bias[c]
    torch.testing.assert_close(layer(x), ref)
    assert layer.out_features == D and sum(p.numel() for p in layer.parameters()) == K + T + D


def test_bias_encoding_bad_input() -> None:
    with pytest.raises(LayerConfigError, match="BiasEncoding: input must have shape"):
        BiasEncoding(K, T, D)(torch.randn(B, K, T + 1, D))
    with pytest.raises(LayerConfigError, match="BiasEncoding: session_len"):
        BiasEncoding(K, 0, D)


# ---------------------------------------------------------------- session interest extractor
def extractor_reference(layer: SessionInterestExtractor, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(x.shape[0], x.shape[1], x.shape[3], dtype=x.dtype)
    for b in range(x.shape[0]):
        for k in range(x.shape[1]):
            real = x[b, k][mask[b, k]]  # (L, D): the session's real behaviours only, no mask needed
            if len(real):
                out[b, k] = layer.encoder(real.unsqueeze(0))[0].mean(dim=0)
    return out


def test_extractor_equals_per_session_loop() -> None:
    layer = SessionInterestExtractor(D, num_heads=2, ffn_dim=8).double()
    x = torch.randn(B, K, T, D, dtype=torch.float64, requires_grad=True)
    mask = session_mask()
    calls: list[tuple[int, ...]] = []
    layer.encoder.register_forward_hook(lambda _m, args, _o: calls.append(tuple(args[0].shape)))
    out = layer(x, mask)
    assert calls == [(B * K, T, D)]  # the K sessions of all rows go through the shared layer in one call
    assert out.shape == (B, K, D) and layer.out_features == D
    torch.testing.assert_close(out, extractor_reference(layer, x, mask))
    assert (out[~mask.any(dim=2)] == 0).all()  # empty sessions (and the row without any) give 0
    out.pow(2).sum().backward()
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_extractor_zero_padding_embeddings_stay_finite() -> None:
    """Padding ids embed to exact zeros: LayerNorm of a constant vector and an all-masked session."""
    layer = SessionInterestExtractor(D, num_heads=2)
    mask = session_mask()
    x = (torch.randn(B, K, T, D) * mask.unsqueeze(3)).requires_grad_()
    out = layer(x, mask)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


def test_extractor_bad_input() -> None:
    layer = SessionInterestExtractor(D, num_heads=2)
    with pytest.raises(LayerConfigError, match="SessionInterestExtractor: mask must have shape"):
        layer(torch.randn(B, K, T, D), torch.ones(B, K, dtype=torch.bool))
    with pytest.raises(LayerConfigError, match="SessionInterestExtractor: input must have shape"):
        layer(torch.randn(B, K, D), torch.ones(B, K, dtype=torch.bool))
    with pytest.raises(LayerConfigError, match="num_heads=3"):
        SessionInterestExtractor(D, num_heads=3)


# ---------------------------------------------------------------- Bi-LSTM
def run_stack(layer: BiLSTM, lstms: nn.ModuleList, seq: torch.Tensor) -> torch.Tensor:
    for i, lstm in enumerate(lstms):
        out = lstm(seq)[0]
        seq = out + seq if i >= layer.layers - layer.res_layers else out
    return seq


def bilstm_reference(layer: BiLSTM, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row alone, on its real steps only, with the layer's own LSTM modules."""
    out = torch.zeros(x.shape[0], x.shape[1], layer.out_features, dtype=x.dtype)
    merge = {
        "ave": lambda f, b: (f + b) / 2,
        "sum": lambda f, b: f + b,
        "mul": lambda f, b: f * b,
        "concat": lambda f, b: torch.cat([f, b], dim=1),
        "fw": lambda f, b: f,
        "bw": lambda f, b: b,
    }[layer.merge_mode]
    for row in range(x.shape[0]):
        real = mask[row].nonzero().squeeze(1)
        if len(real) == 0:
            continue
        seq = x[row, real].unsqueeze(0)  # (1, L, D_in)
        fw = run_stack(layer, layer.fw, seq)[0]
        bw = run_stack(layer, layer.bw, seq.flip(1))[0].flip(0)
        out[row, real] = merge(fw, bw)
    return out


@pytest.mark.parametrize("merge_mode", ["ave", "sum", "mul", "concat", "fw", "bw"])
@pytest.mark.parametrize(("layers", "res_layers", "input_size"), [(1, 0, D), (2, 1, D), (3, 3, H)])
def test_bilstm_equals_per_row_loop(merge_mode: str, layers: int, res_layers: int, input_size: int) -> None:
    layer = BiLSTM(input_size, H, layers=layers, res_layers=res_layers, merge_mode=merge_mode).double()
    x = torch.randn(B, K, input_size, dtype=torch.float64, requires_grad=True)
    mask = row_mask()
    out = layer(x, mask)
    assert out.shape == (B, K, layer.out_features)
    assert layer.out_features == (2 * H if merge_mode == "concat" else H)
    # a stack the merge does not read is not built
    assert len(layer.fw) == (0 if merge_mode == "bw" else layers)
    assert len(layer.bw) == (0 if merge_mode == "fw" else layers)
    torch.testing.assert_close(out, bilstm_reference(layer, x, mask))
    out.pow(2).sum().backward()
    assert torch.isfinite(x.grad).all() and (x.grad[~mask] == 0).all()  # padded steps feed nothing


def test_bilstm_full_rows_match_torch_bidirectional_lstm() -> None:
    layer = BiLSTM(D, H, merge_mode="concat").double()
    ref = nn.LSTM(D, H, batch_first=True, bidirectional=True).double()
    with torch.no_grad():
        for suffix, lstm in (("", layer.fw[0]), ("_reverse", layer.bw[0])):
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(ref, f"{name}_l0{suffix}").copy_(getattr(lstm, f"{name}_l0"))
    x = torch.randn(B, K, D, dtype=torch.float64)
    torch.testing.assert_close(layer(x), ref(x)[0])
    torch.testing.assert_close(layer(x, torch.ones(B, K, dtype=torch.bool)), ref(x)[0])


def test_bilstm_dropout_only_in_training() -> None:
    layer = BiLSTM(D, H, layers=2, dropout=0.5).double().eval()
    x = torch.randn(B, K, D, dtype=torch.float64)
    torch.testing.assert_close(layer(x, row_mask()), bilstm_reference(layer, x, row_mask()))
    layer.train()
    assert not torch.allclose(layer(x), layer(x))


def test_bilstm_init_as_keras() -> None:
    layer = BiLSTM(D, H, layers=2)
    for lstm in list(layer.fw) + list(layer.bw):
        torch.testing.assert_close(lstm.bias_ih_l0 + lstm.bias_hh_l0, torch.ones(4 * H))
        w = lstm.weight_hh_l0  # (4H, H), orthonormal columns
        torch.testing.assert_close(w.T @ w, torch.eye(H), atol=1e-5, rtol=0)


def test_bilstm_bad_options() -> None:
    with pytest.raises(LayerConfigError, match="BiLSTM: res_layers=2 .* input_size == hidden_size"):
        BiLSTM(D, H, layers=2, res_layers=2)
    BiLSTM(D, H, layers=2, res_layers=1)  # residual from the second layer on: sizes already match
    with pytest.raises(LayerConfigError, match=r"BiLSTM: res_layers must be in \[0, layers=1\]"):
        BiLSTM(D, D, res_layers=2)
    with pytest.raises(LayerConfigError, match="BiLSTM: unknown merge_mode='max'"):
        BiLSTM(D, H, merge_mode="max")
    with pytest.raises(LayerConfigError, match="BiLSTM: mask must have shape"):
        BiLSTM(D, H)(torch.randn(B, K, D), torch.ones(B, K + 1, dtype=torch.bool))


# ---------------------------------------------------------------- session activation
def activation_reference(layer: SessionActivation, q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor):
    pooled = torch.zeros(keys.shape[0], keys.shape[2], dtype=keys.dtype)
    weights = torch.zeros(keys.shape[:2], dtype=keys.dtype)
    for b in range(keys.shape[0]):
        real = [k for k in range(keys.shape[1]) if mask[b, k]]
        if not real:
            continue
        logits = torch.stack([keys[b, k] @ layer.weight @ q[b] for k in real])  # I_k W x
        a = torch.softmax(logits, dim=0)
        weights[b, real] = a
        pooled[b] = sum(a[n] * keys[b, k] for n, k in enumerate(real))
    return pooled, weights


def test_session_activation_equals_loop() -> None:
    layer = SessionActivation(D, 2 * H).double()
    q = torch.randn(B, D, dtype=torch.float64, requires_grad=True)
    keys = torch.randn(B, K, 2 * H, dtype=torch.float64, requires_grad=True)
    mask = row_mask()
    out = layer(q, keys, mask)
    ref_pooled, ref_weights = activation_reference(layer, q, keys, mask)
    assert out.shape == (B, 2 * H) and layer.out_features == 2 * H
    torch.testing.assert_close(out, ref_pooled)
    torch.testing.assert_close(layer.scores(q, keys, mask), ref_weights)
    assert (out[2] == 0).all()  # the row without a session
    out.pow(2).sum().backward()
    assert all(torch.isfinite(g).all() for g in (q.grad, keys.grad, layer.weight.grad))
    # no mask = every session real
    torch.testing.assert_close(
        layer(q, keys), activation_reference(layer, q, keys, torch.ones(B, K, dtype=torch.bool))[0]
    )


def test_session_activation_bad_input() -> None:
    layer = SessionActivation(D)
    assert layer.key_dim == D
    with pytest.raises(LayerConfigError, match="SessionActivation: keys must have shape"):
        layer(torch.randn(B, D), torch.randn(B, K, D + 1))
    with pytest.raises(LayerConfigError, match="SessionActivation: query must have shape"):
        layer(torch.randn(B, D + 1), torch.randn(B, K, D))


# ---------------------------------------------------------------- contract for every layer
def _inputs(name: str, b: int = B) -> tuple[torch.Tensor, ...]:
    mask = session_mask()[:b]
    if name == "bias":
        return (torch.randn(b, K, T, D, dtype=torch.float64),)
    if name == "extractor":
        return torch.randn(b, K, T, D, dtype=torch.float64), mask
    if name == "activation":
        return (
            torch.randn(b, D, dtype=torch.float64),
            torch.randn(b, K, H, dtype=torch.float64),
            mask.any(dim=2),
        )
    return torch.randn(b, K, D, dtype=torch.float64), mask.any(dim=2)


LAYERS: dict[str, Callable[[], nn.Module]] = {
    "bias": lambda: BiasEncoding(K, T, D),
    "extractor": lambda: SessionInterestExtractor(D, num_heads=2),
    "bilstm": lambda: BiLSTM(D, H, layers=2, res_layers=1, merge_mode="concat"),
    "activation": lambda: SessionActivation(D, H),
}


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_contract(name: str) -> None:
    layer = LAYERS[name]().double()
    inputs = _inputs(name)
    inputs[0].requires_grad_()
    out = layer(*inputs)
    assert torch.isfinite(out).all() and layer.out_features == out.shape[-1]
    torch.testing.assert_close(layer(*(t[1:2] for t in inputs)), out[1:2])  # each row is computed alone
    torch.testing.assert_close(torch.jit.script(layer)(*inputs), out)  # TorchScript-able, same numbers
    out.pow(2).sum().backward()
    assert torch.isfinite(inputs[0].grad).all() and inputs[0].grad.abs().sum() > 0
    for pname, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
    torch.manual_seed(1)
    layer.reset_parameters()
    first = {k: v.clone() for k, v in layer.state_dict().items()}
    torch.manual_seed(1)
    layer.reset_parameters()
    for k, v in layer.state_dict().items():
        torch.testing.assert_close(v, first[k])


@pytest.mark.filterwarnings("ignore:The tensor attributes .*_flat_weights:UserWarning")
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_torch_export_dynamic_batch(name: str) -> None:
    layer = LAYERS[name]().double().eval()
    inputs = _inputs(name)
    batch = torch.export.Dim("batch")
    program = torch.export.export(layer, inputs, dynamic_shapes=tuple({0: batch} for _ in inputs))
    more = tuple(torch.cat([t, t[:3]]) for t in _inputs(name))  # 7 rows
    torch.testing.assert_close(program.module()(*more), layer(*more))
