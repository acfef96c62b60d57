"""DIEN's recurrent layers against naive references: a per-row, per-step GRU loop written from the formulas,
torch.nn.GRU with the same weights, and a per-pair loop for the auxiliary loss."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from ctrkit.errors import LayerConfigError
from ctrkit.nn.rnn import GRU_TYPES, AttentionGRU, AuxiliaryNet, dien_auxiliary_loss

B, T, I, H = 4, 5, 3, 2
LENGTHS = [5, 2, 0, 3]  # one full row, one empty history


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def lengths_mask(lengths: list[int], t: int = T) -> torch.Tensor:
    return torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # (B, T) right-padded


def build(gru_type: str, fused: bool = True) -> AttentionGRU:
    return AttentionGRU(I, H, gru_type=gru_type, fused=fused).double()


@torch.no_grad()
def gru_loop(layer: AttentionGRU, x, mask, att) -> tuple[torch.Tensor, torch.Tensor]:
    """One row, one step at a time, from the formulas of the AttentionGRU docstring."""
    g = layer.gru
    w_ir, w_iz, w_in = g.weight_ih_l0.chunk(3)
    w_hr, w_hz, w_hn = g.weight_hh_l0.chunk(3)
    b_ir, b_iz, b_in = g.bias_ih_l0.chunk(3)
    b_hr, b_hz, b_hn = g.bias_hh_l0.chunk(3)
    kind = layer.gru_type
    outputs = torch.zeros(x.shape[0], x.shape[1], H, dtype=x.dtype)
    finals = torch.zeros(x.shape[0], H, dtype=x.dtype)
    for b in range(x.shape[0]):
        h = torch.zeros(H, dtype=x.dtype)
        for t in range(x.shape[1]):
            if mask[b, t]:
                a = float(att[b, t]) if att is not None else 1.0
                xt = x[b, t] * a if kind == "AIGRU" else x[b, t]
                r = torch.sigmoid(w_ir @ xt + b_ir + w_hr @ h + b_hr)
                u = 1 - torch.sigmoid(w_iz @ xt + b_iz + w_hz @ h + b_hz)  # the paper's update gate
                cand = torch.tanh(w_in @ xt + b_in + r * (w_hn @ h + b_hn))
                if kind == "AGRU":
                    h = (1 - a) * h + a * cand
                elif kind == "AUGRU":
                    h = (1 - a * u) * h + a * u * cand
                else:
                    h = (1 - u) * h + u * cand
            outputs[b, t] = h
        finals[b] = h
    return outputs, finals


def data(lengths: list[int] = LENGTHS, t: int = T):
    x = torch.randn(len(lengths), t, I, dtype=torch.float64)
    att = torch.rand(len(lengths), t, dtype=torch.float64)
    return x, lengths_mask(lengths, t), att


# fused: GRU / AIGRU on torch's GRU kernel, AGRU / AUGRU on the hand-written BPTT; unfused: the autograd loop
CASES = [(kind, fused) for fused in (True, False) for kind in GRU_TYPES]


@pytest.mark.parametrize("gru_type, fused", CASES)
def test_every_type_against_the_per_step_loop(gru_type, fused) -> None:
    layer = build(gru_type, fused)
    x, mask, att = data()
    out, final = layer(x, mask, att)
    ref_out, ref_final = gru_loop(layer, x, mask, att)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(final, ref_final)
    assert torch.equal(final[2], torch.zeros(H, dtype=torch.float64))  # empty history
    torch.testing.assert_close(out[1, 2:], final[1].expand(T - 2, H))  # padded steps keep the state
    assert layer.out_features == H


@pytest.mark.parametrize("fused", [True, False])
def test_gru_equals_torch_gru_with_the_same_weights(fused) -> None:
    layer = build("GRU", fused)
    torch_gru = nn.GRU(I, H, batch_first=True).double()
    torch_gru.load_state_dict({k.removeprefix("gru."): v for k, v in layer.state_dict().items()})
    x, mask, _ = data()
    out, final = layer(x, mask)
    for b, n in enumerate(LENGTHS):
        if n:
            ref, h_n = torch_gru(x[b : b + 1, :n])  # the row's real steps only
            torch.testing.assert_close(out[b, :n], ref[0])
            torch.testing.assert_close(final[b], h_n[0, 0])
    full, _ = torch_gru(x)
    torch.testing.assert_close(layer(x)[0], full)  # mask None: all real


def test_attention_limits() -> None:
    x, mask, att = data()
    gru, augru, agru, aigru = (build(kind, fused=False) for kind in ("GRU", "AUGRU", "AGRU", "AIGRU"))
    for other in (augru, agru, aigru):
        other.load_state_dict(gru.state_dict())
    ones = torch.ones(B, T, dtype=torch.float64)
    torch.testing.assert_close(augru(x, mask, ones), gru(x, mask))  # AUGRU with a = 1 is the GRU
    torch.testing.assert_close(aigru(x, mask, att), gru(x * att.unsqueeze(2), mask))  # AIGRU: GRU on a·x
    some_zero = att.clone()
    some_zero[:, 2] = 0.0
    out, _ = agru(x, mask, some_zero)
    torch.testing.assert_close(out[:, 2], out[:, 1])  # AGRU with a = 0 keeps the state
    out, _ = augru(x, mask, some_zero)
    torch.testing.assert_close(out[:, 2], out[:, 1])  # so does AUGRU (ũ = 0)


def test_a_mask_with_holes_in_the_loop_path() -> None:
    layer = build("AUGRU")
    x, _, att = data()
    mask = torch.tensor([[1, 0, 1, 1, 0], [0, 0, 1, 0, 1], [0, 0, 0, 0, 0], [1, 1, 0, 1, 1]], dtype=torch.bool)
    out, final = layer(x, mask, att)
    ref_out, ref_final = gru_loop(layer, x, mask, att)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(final, ref_final)


@pytest.mark.parametrize("gru_type, fused", CASES)
def test_padding_changes_nothing_and_gets_no_gradient(gru_type, fused) -> None:
    layer = build(gru_type, fused)
    x, mask, att = data()
    x.requires_grad_(True)
    att.requires_grad_(True)
    out, final = layer(x, mask, att)
    x2, att2 = x.detach().clone(), att.detach().clone()
    x2[~mask], att2[~mask] = 50.0, 0.9
    out2, final2 = layer(x2, mask, att2)
    torch.testing.assert_close(out2, out.detach())
    torch.testing.assert_close(final2, final.detach())
    (out.sum() + final.sum()).backward()
    assert (x.grad[~mask] == 0).all() and torch.isfinite(x.grad).all()
    if gru_type == "GRU":
        assert att.grad is None  # the plain GRU ignores att
    else:
        assert (att.grad[~mask] == 0).all() and (att.grad[mask] != 0).any()


@pytest.mark.parametrize("gru_type, fused", CASES)
def test_gradcheck(gru_type, fused) -> None:
    layer = build(gru_type, fused)
    x, mask, att = data([3, 1, 0], 3)
    x.requires_grad_(True)
    att.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x_, a_: layer(x_, mask, a_), (x, att))


def test_attention_gru_bad_arguments() -> None:
    with pytest.raises(LayerConfigError, match="unknown gru_type='LSTM'; valid: GRU, AIGRU, AGRU, AUGRU"):
        AttentionGRU(3, 2, gru_type="LSTM")
    with pytest.raises(LayerConfigError, match="hidden_size"):
        AttentionGRU(3, 0)
    x, mask, _ = data()
    with pytest.raises(LayerConfigError, match="gru_type='AUGRU' needs att"):
        build("AUGRU")(x, mask)
    with pytest.raises(LayerConfigError, match="x must be"):
        build("GRU")(x[..., :2], mask)
    with pytest.raises(LayerConfigError, match="mask must have shape"):
        build("GRU")(x, mask[:, :3])
    out, final = build("GRU")(x[:, :0], mask[:, :0])  # T = 0
    assert out.shape == (B, 0, H) and torch.equal(final, torch.zeros(B, H, dtype=torch.float64))


# ---- auxiliary loss ---------------------------------------------------------------------------------


def aux_loop(h, pos, neg, mask, score) -> torch.Tensor:
    terms = []
    for b in range(h.shape[0]):
        for t in range(h.shape[1] - 1):
            if mask[b, t] and mask[b, t + 1]:
                p = torch.sigmoid(score(h[b, t], pos[b, t + 1]))
                n = torch.sigmoid(score(h[b, t], neg[b, t + 1]))
                terms.append(-torch.log(p) - torch.log(1 - n))
    return sum(terms) / len(terms) if terms else torch.zeros((), dtype=h.dtype)


def aux_data(d: int):
    h = torch.randn(B, T, H, dtype=torch.float64, requires_grad=True)
    pos, neg = torch.randn(B, T, d, dtype=torch.float64), torch.randn(B, T, d, dtype=torch.float64)
    return h, pos, neg, lengths_mask(LENGTHS)


def test_auxiliary_loss_inner_product() -> None:
    h, pos, neg, mask = aux_data(H)
    loss = dien_auxiliary_loss(h, pos, neg, mask)
    torch.testing.assert_close(loss, aux_loop(h, pos, neg, mask, lambda a, e: a @ e))
    loss.backward()
    assert (h.grad[:, -1] == 0).all() and (h.grad[~mask] == 0).all()  # no pair starts there
    with pytest.raises(LayerConfigError, match="H == D"):
        dien_auxiliary_loss(h, pos[..., :1], neg[..., :1], mask)


@pytest.mark.parametrize("generic", [False, True])
def test_auxiliary_loss_with_a_network(generic) -> None:
    d = 3
    h, pos, neg, mask = aux_data(d)
    aux = AuxiliaryNet(H + d, hidden=(4, 3)).double()
    # a generic module scoring the concatenation [h; e] goes the concatenation way, AuxiliaryNet the split one
    net = nn.Sequential(aux.mlp, aux.out, nn.Flatten(0)) if generic else aux
    loss = dien_auxiliary_loss(h, pos, neg, mask, net)
    ref = aux_loop(h, pos, neg, mask, lambda a, e: aux(torch.cat([a, e])[None])[0])
    torch.testing.assert_close(loss, ref)
    s_pos, s_neg = aux.pair_logits(h, pos, neg)
    torch.testing.assert_close(s_pos, aux(torch.cat([h, pos], dim=2)))
    torch.testing.assert_close(s_neg, aux(torch.cat([h, neg], dim=2)))
    with pytest.raises(LayerConfigError, match="must be in_features=5"):
        aux.pair_logits(h, pos[..., :2], neg[..., :2])


def test_auxiliary_loss_without_pairs_and_gradcheck() -> None:
    h, pos, neg, _ = aux_data(H)
    single = lengths_mask([1, 0, 1, 0])  # no (t, t+1) pair of real steps
    loss = dien_auxiliary_loss(h, pos, neg, single)
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert (h.grad == 0).all()
    aux = AuxiliaryNet(H + 2, hidden=(3,)).double()
    hh = torch.randn(2, 3, H, dtype=torch.float64, requires_grad=True)
    pp = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    nn_ = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    m = lengths_mask([3, 2], 3)
    assert torch.autograd.gradcheck(lambda a, b, c: dien_auxiliary_loss(a, b, c, m, aux), (hh, pp, nn_))
    # three real pairs with the inner product at 0: each pair costs 2 log 2
    zero = torch.zeros(2, 3, H, dtype=torch.float64)
    torch.testing.assert_close(dien_auxiliary_loss(zero, zero, zero, m), torch.tensor(2 * math.log(2), dtype=torch.float64))
    with pytest.raises(LayerConfigError, match="AuxiliaryNet: need in_features"):
        AuxiliaryNet(4, hidden=())


@pytest.mark.parametrize("update_gate", [True, False])
@pytest.mark.parametrize("with_d_out", [True, False])
def test_scripted_loops_equal_the_python_loops(update_gate, with_d_out) -> None:
    """The AGRU / AUGRU node runs its loops through TorchScript; the Python functions (the fallback) must give
    the same values bit for bit, forward and backward, with and without a gradient on the per-step outputs."""
    from ctrkit.nn import rnn

    scripted = rnn._loops()
    if scripted[0] is rnn._forward_loop:
        pytest.skip("TorchScript unavailable here: the node runs the Python loops")
    b, t, hs = 4, 6, 3
    gi, att = torch.randn(b, t, 3 * hs), torch.rand(b, t)
    w_hh, b_hh = torch.randn(3 * hs, hs), torch.randn(3 * hs)
    mask = lengths_mask([6, 2, 0, 4], t)
    fwd_py = rnn._forward_loop(gi, w_hh, b_hh, att, mask, update_gate)
    fwd_js = scripted[0](gi, w_hh, b_hh, att, mask, update_gate)
    assert all(torch.equal(p, s) for p, s in zip(fwd_py, fwd_js))
    out, _, rzn, g_n = fwd_py
    prev = torch.cat([out.new_zeros(b, 1, hs), out[:, :-1]], 1)
    d_out = torch.randn(b, t, hs) if with_d_out else None
    dh = torch.randn(b, hs)
    bwd_py = rnn._backward_loop(d_out, dh, w_hh, att, mask, prev, rzn, g_n, update_gate)
    bwd_js = scripted[1](d_out, dh, w_hh, att, mask, prev, rzn, g_n, update_gate)
    assert all(torch.equal(p, s) for p, s in zip(bwd_py, bwd_js))
    assert (bwd_py[2][~mask] == 0).all()  # no attention gradient at padding
