"""CTR-zoo interaction layers checked against naive loop references (float64)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from ctrkit.errors import LayerConfigError
from ctrkit.nn.attention import (
    AFMAttention,
    MultiHeadSelfAttention,
    TransformerEncoderLayer,
    positional_encoding,
)
from ctrkit.nn.cin import CIN
from ctrkit.nn.fm import BiInteractionPooling, FFMInteraction, FMInteraction, pair_indices
from ctrkit.nn.product import InnerProduct, PNNProductLayer, pooled_outer_product
from ctrkit.nn.senet import SENET, BilinearInteraction

B, F, D = 3, 5, 4
PAIRS = list(itertools.combinations(range(F), 2))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def emb(b: int = B, f: int = F, d: int = D) -> torch.Tensor:
    return torch.randn(b, f, d, dtype=torch.float64)


def test_pair_indices_order() -> None:
    rows, cols = pair_indices(F)
    assert list(zip(rows.tolist(), cols.tolist())) == PAIRS


# ---------------------------------------------------------------- FM family
def test_fm_equals_pairwise_inner_products() -> None:
    e = emb()
    ref = torch.stack([sum(e[b, i] @ e[b, j] for i, j in PAIRS) for b in range(B)]).unsqueeze(1)
    out = FMInteraction()(e)
    assert out.shape == (B, 1) and FMInteraction.out_features == 1
    torch.testing.assert_close(out, ref)


def test_fm_gradcheck() -> None:
    e = emb(2, 3, 2).requires_grad_()
    assert torch.autograd.gradcheck(FMInteraction(), (e,))


def test_bi_interaction_equals_pairwise_hadamard_sum() -> None:
    e = emb()
    ref = torch.stack([sum(e[b, i] * e[b, j] for i, j in PAIRS) for b in range(B)])
    layer = BiInteractionPooling(embedding_dim=D)
    out = layer(e)
    assert out.shape == (B, D) and layer.out_features == D
    torch.testing.assert_close(out, ref)
    # summing over D gives FM
    torch.testing.assert_close(out.sum(1, keepdim=True), FMInteraction()(e))


def test_ffm_equals_loops() -> None:
    e = torch.randn(B, F, F, D, dtype=torch.float64)  # e[b, i, j] = v_{i, f_j}
    ref = torch.zeros(B, 1, dtype=torch.float64)
    for b in range(B):
        for i in range(F):
            for j in range(i + 1, F):
                ref[b, 0] += e[b, i, j] @ e[b, j, i]
    layer = FFMInteraction(F)
    torch.testing.assert_close(layer(e), ref)
    assert layer.out_features == 1
    assert "rows" not in layer.state_dict()  # index buffers are not checkpointed


def test_ffm_bad_input() -> None:
    with pytest.raises(LayerConfigError, match="FFMInteraction: num_fields"):
        FFMInteraction(1)
    with pytest.raises(LayerConfigError, match="FFMInteraction: expected field-aware"):
        FFMInteraction(F)(emb())


def test_fm_rejects_2d_input() -> None:
    with pytest.raises(ValueError, match="FMInteraction"):
        FMInteraction()(torch.randn(3, 4))


# ---------------------------------------------------------------- PNN
def test_inner_product_equals_loops() -> None:
    e = emb()
    ref = torch.tensor([[float(e[b, i] @ e[b, j]) for i, j in PAIRS] for b in range(B)], dtype=torch.float64)
    layer = InnerProduct(F)
    torch.testing.assert_close(layer(e), ref)
    assert layer.out_features == len(PAIRS)


def test_pooled_outer_product() -> None:
    e = emb()
    ref = torch.stack([sum(torch.outer(e[b, i], e[b, j]) for i in range(F) for j in range(F)) for b in range(B)])
    torch.testing.assert_close(pooled_outer_product(e), ref)


@pytest.mark.parametrize("mode", ["inner", "outer", "both"])
def test_pnn_product_layer_equals_loops(mode: str) -> None:
    units = 3
    e = emb()
    layer = PNNProductLayer(F, D, units, mode=mode).double()
    with torch.no_grad():
        layer.bias.normal_()
    ref = torch.zeros(B, units, dtype=torch.float64)
    for b in range(B):
        for n in range(units):
            lz = sum(layer.linear_z.weight[n, f * D + d] * e[b, f, d] for f in range(F) for d in range(D))
            lp = 0.0
            if mode in ("inner", "both"):
                lp += sum(layer.linear_inner.weight[n, p] * (e[b, i] @ e[b, j]) for p, (i, j) in enumerate(PAIRS))
            if mode in ("outer", "both"):
                f_sum = e[b].sum(0)
                lp += sum(
                    layer.linear_outer.weight[n, d1 * D + d2] * f_sum[d1] * f_sum[d2]
                    for d1 in range(D)
                    for d2 in range(D)
                )
            ref[b, n] = lz + lp + layer.bias[n]
    out = layer(e)
    assert out.shape == (B, units) and layer.out_features == units
    torch.testing.assert_close(out, ref)


def test_pnn_unknown_mode() -> None:
    with pytest.raises(LayerConfigError, match="PNNProductLayer: unknown mode='outter'.*inner, outer, both"):
        PNNProductLayer(F, D, 4, mode="outter")


# ---------------------------------------------------------------- CIN
def cin_reference(layer: CIN, e: torch.Tensor) -> torch.Tensor:
    """x^k_{h,d} = act(Σ_i Σ_j W^k[h,i,j] x^{k-1}_{i,d} x^0_{j,d} + b), with explicit loops."""
    bsz, f, d = e.shape
    outs = []
    for b in range(bsz):
        x0, h_prev, pooled = e[b], e[b], []
        for k, cin_layer in enumerate(layer.layers):
            w = cin_layer.weight
            hk = w.shape[0]
            x = torch.zeros(hk, d, dtype=e.dtype)
            for h in range(hk):
                for i in range(h_prev.shape[0]):
                    for j in range(f):
                        x[h] += w[h, i, j] * h_prev[i] * x0[j]
                if cin_layer.bias is not None:
                    x[h] += cin_layer.bias[h]
            x = layer.activation(x)
            last = k == len(layer.layers) - 1
            if layer.split_half and not last:
                h_prev, direct = x[: hk // 2], x[hk // 2 :]
            else:
                h_prev, direct = x, x
            pooled.append(direct.sum(1))
        outs.append(torch.cat(pooled))
    return torch.stack(outs)


@pytest.mark.parametrize(
    ("split_half", "activation", "bias"), [(True, "identity", False), (False, "relu", True), (True, "tanh", True)]
)
def test_cin_equals_loops(split_half: bool, activation: str, bias: bool) -> None:
    e = emb()
    layer = CIN(F, D, layer_sizes=(4, 6, 3), split_half=split_half, activation=activation, bias=bias).double()
    if bias:
        with torch.no_grad():
            for cin_layer in layer.layers:
                cin_layer.bias.normal_()
    out = layer(e)
    expected_width = (2 + 3 + 3) if split_half else (4 + 6 + 3)
    assert out.shape == (B, expected_width) and layer.out_features == expected_width
    torch.testing.assert_close(out, cin_reference(layer, e))


@pytest.mark.parametrize(
    ("sizes", "split_half", "activation", "bias"),
    [((4, 6, 3), True, "identity", False), ((4, 6, 3), True, "identity", True), ((4, 5), False, "identity", True),
     ((6,), True, "identity", False), ((4, 6, 3), True, "relu", True)],
)
def test_cin_logit_equals_pooled_maps_through_a_linear_unit(sizes, split_half, activation, bias) -> None:
    """The folded path (identity) and the plain one give forward(e) @ w, and the same gradients."""
    layer = CIN(F, D, layer_sizes=sizes, split_half=split_half, activation=activation, bias=bias).double()
    with torch.no_grad():
        for cin_layer in layer.layers:
            if cin_layer.bias is not None:
                cin_layer.bias.normal_()
    w = torch.randn(layer.out_features, dtype=torch.double, requires_grad=True)
    e1 = emb().requires_grad_()
    e2 = e1.detach().clone().requires_grad_()
    got = layer.logit(e1, w.view(1, -1))
    got_grads = torch.autograd.grad(got.square().sum(), [e1, w, *layer.parameters()])
    want = layer(e2) @ w
    want_grads = torch.autograd.grad(want.square().sum(), [e2, w, *layer.parameters()])
    assert got.shape == (B,)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, cin_reference(layer, e2.detach()) @ w.detach())
    for g, r in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, r)
    with pytest.raises(LayerConfigError, match="CIN.logit: weight has 3 entries"):
        layer.logit(e1, w[:3])


def test_cin_bad_options() -> None:
    with pytest.raises(LayerConfigError, match="CIN: with split_half=True"):
        CIN(F, D, layer_sizes=(3, 4))
    CIN(F, D, layer_sizes=(4, 3))  # odd last layer is fine
    with pytest.raises(LayerConfigError, match="CIN: unknown activation='softmax'; valid: gelu, identity"):
        CIN(F, D, activation="softmax")
    assert isinstance(CIN(F, D, activation="GELU").activation, torch.nn.GELU)  # the one factory's names
    with pytest.raises(LayerConfigError, match="CIN: built with num_fields=5"):
        CIN(F, D)(emb(f=4))


# ---------------------------------------------------------------- FiBiNET
@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_senet_equals_loops(pooling: str) -> None:
    e = emb(f=7)
    layer = SENET(7, reduction_ratio=3, pooling=pooling).double()
    w1, w2 = layer.excite[0].weight, layer.excite[2].weight
    assert w1.shape == (2, 7) and w2.shape == (7, 2)  # F' = max(1, 7 // 3) = 2
    ref = torch.empty_like(e)
    for b in range(B):
        z = torch.tensor([float(e[b, f].mean() if pooling == "mean" else e[b, f].max()) for f in range(7)])
        a = torch.relu(w2 @ torch.relu(w1 @ z.double()))
        for f in range(7):
            ref[b, f] = e[b, f] * a[f]
    torch.testing.assert_close(layer(e), ref)
    assert SENET(2, reduction_ratio=8).hidden == 1


def test_senet_bad_pooling() -> None:
    with pytest.raises(LayerConfigError, match="SENET: unknown pooling='sum'; valid: mean, max"):
        SENET(F, pooling="sum")


@pytest.mark.parametrize(
    ("bilinear_type", "n_params"),
    [("field_all", D * D), ("field_each", (F - 1) * D * D), ("field_interaction", len(PAIRS) * D * D)],
)
def test_bilinear_equals_loops_and_param_count(bilinear_type: str, n_params: int) -> None:
    e = emb()
    layer = BilinearInteraction(F, D, bilinear_type=bilinear_type).double()
    assert sum(p.numel() for p in layer.parameters()) == n_params
    ref = torch.empty(B, len(PAIRS), D, dtype=torch.float64)
    for b in range(B):
        for p, (i, j) in enumerate(PAIRS):
            if bilinear_type == "field_all":
                w = layer.weight
            elif bilinear_type == "field_each":
                w = layer.weight[i]
            else:
                w = layer.weight[p]
            left = torch.stack([sum(e[b, i, d] * w[d, c] for d in range(D)) for c in range(D)])
            ref[b, p] = left * e[b, j]
    out = layer(e)
    assert out.shape == (B, len(PAIRS), D) and layer.out_features == len(PAIRS) * D
    torch.testing.assert_close(out, ref)


def test_bilinear_bad_options() -> None:
    with pytest.raises(LayerConfigError, match="bilinear_type='each'.*field_all, field_each, field_interaction"):
        BilinearInteraction(F, D, bilinear_type="each")
    with pytest.raises(LayerConfigError, match="BilinearInteraction: num_fields must be >= 2"):
        BilinearInteraction(1, D)


# ---------------------------------------------------------------- AFM
def test_afm_equals_loops() -> None:
    e = emb()
    layer = AFMAttention(D, attention_dim=3, dropout=0.5).double().eval()
    w, bias, h, proj = layer.attention.weight, layer.attention.bias, layer.h, layer.projection
    ref = torch.empty(B, 1, dtype=torch.float64)
    ref_weights = torch.empty(B, len(PAIRS), dtype=torch.float64)
    for b in range(B):
        prods = [e[b, i] * e[b, j] for i, j in PAIRS]
        scores = torch.stack([h @ torch.relu(w @ p + bias) for p in prods])
        a = torch.exp(scores) / torch.exp(scores).sum()
        pooled = sum(a[k] * prods[k] for k in range(len(PAIRS)))
        ref[b, 0] = proj @ pooled
        ref_weights[b] = a
    torch.testing.assert_close(layer(e), ref)
    torch.testing.assert_close(layer.pool(e)[1], ref_weights)
    no_proj = AFMAttention(D, use_projection=False)
    assert no_proj(e.float()).shape == (B, D) and no_proj.out_features == D and layer.out_features == 1


def test_afm_needs_two_fields() -> None:
    with pytest.raises(LayerConfigError, match="AFMAttention: needs at least 2 fields"):
        AFMAttention(D)(emb(f=1))
    with pytest.raises(LayerConfigError, match="AFMAttention: num_fields must be >= 2"):
        AFMAttention(D, num_fields=1)


# ---------------------------------------------------------------- AutoInt / Transformer
def mhsa_reference(layer: MultiHeadSelfAttention, e: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    bsz, f, _ = e.shape
    dh = layer.head_dim
    out = torch.zeros(bsz, f, layer.out_features, dtype=e.dtype)
    for b in range(bsz):
        for hd in range(layer.num_heads):
            sl = slice(hd * dh, (hd + 1) * dh)
            wq, wk, wv = (lin.weight[sl] for lin in (layer.w_q, layer.w_k, layer.w_v))  # (d', D)
            for m in range(f):
                q = wq @ e[b, m]
                keys = [k for k in range(f) if mask is None or bool(mask[b, k])]
                if not keys:
                    continue
                s = torch.stack([q @ (wk @ e[b, k]) for k in keys])
                if layer.scaled:
                    s = s / math.sqrt(dh)
                a = torch.softmax(s, 0)
                out[b, m, sl] = sum(a[n] * (wv @ e[b, k]) for n, k in enumerate(keys))
        if layer.w_res is not None:
            out[b] += e[b] @ layer.w_res.weight.T
    if layer.use_relu:
        out = torch.relu(out)
    if layer.norm is not None:
        out = layer.norm(out)
    return out


@pytest.mark.parametrize(
    ("scaled", "use_residual", "layer_norm", "masked"),
    [(False, True, False, False), (True, False, False, True), (False, True, True, True)],
)
def test_mhsa_equals_loops(scaled: bool, use_residual: bool, layer_norm: bool, masked: bool) -> None:
    e = emb()
    layer = MultiHeadSelfAttention(
        D, num_heads=2, head_dim=3, scaled=scaled, use_residual=use_residual, layer_norm=layer_norm
    ).double()
    mask = None
    if masked:
        mask = torch.ones(B, F, dtype=torch.bool)
        mask[0, 3:] = False
        mask[1, :] = False  # a fully padded row attends to nothing
    out = layer(e, mask)
    assert out.shape == (B, F, 6) and layer.out_features == 6
    torch.testing.assert_close(out, mhsa_reference(layer, e, mask))
    assert torch.isfinite(out).all()
    out.sum().backward()  # a fully masked row must not leak NaN gradients
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)


def test_mhsa_bad_mask_and_options() -> None:
    with pytest.raises(LayerConfigError, match="MultiHeadSelfAttention: mask must have shape"):
        MultiHeadSelfAttention(D)(emb().float(), torch.ones(B, F + 1, dtype=torch.bool))
    with pytest.raises(LayerConfigError, match="MultiHeadSelfAttention: head_dim"):
        MultiHeadSelfAttention(2, num_heads=4)


def test_positional_encoding_equals_formula() -> None:
    for dim in (6, 5):
        pe = positional_encoding(7, dim)
        ref = torch.empty(7, dim)
        for t in range(7):
            for c in range(dim):
                angle = t / 10000 ** ((c - c % 2) / dim)
                ref[t, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
        torch.testing.assert_close(pe, ref)


def test_transformer_layer_matches_torch() -> None:
    d, heads, ffn = 8, 2, 16
    ours = TransformerEncoderLayer(d, num_heads=heads, ffn_dim=ffn).double()
    ref = torch.nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, batch_first=True).double()
    with torch.no_grad():
        ref.self_attn.in_proj_weight.copy_(torch.cat([ours.attn.w_q.weight, ours.attn.w_k.weight, ours.attn.w_v.weight]))
        ref.self_attn.in_proj_bias.zero_()
        ref.self_attn.out_proj.weight.copy_(ours.w_o.weight)
        ref.self_attn.out_proj.bias.copy_(ours.w_o.bias)
        ref.linear1.load_state_dict(ours.ffn[0].state_dict())
        ref.linear2.load_state_dict(ours.ffn[2].state_dict())
    x = torch.randn(B, 6, d, dtype=torch.float64)
    mask = torch.ones(B, 6, dtype=torch.bool)
    mask[0, 4:] = False
    ref.train()  # no fast path: same math on padded positions too
    torch.testing.assert_close(ours(x, mask), ref(x, src_key_padding_mask=~mask))


# ---------------------------------------------------------------- contract for every layer
LAYERS = {
    "fm": lambda: FMInteraction(),
    "bi": lambda: BiInteractionPooling(embedding_dim=D),
    "inner": lambda: InnerProduct(F),
    "pnn": lambda: PNNProductLayer(F, D, 4, mode="both"),
    "cin": lambda: CIN(F, D, layer_sizes=(4, 2), bias=True),
    "senet": lambda: SENET(F),
    "bilinear": lambda: BilinearInteraction(F, D, bilinear_type="field_each"),
    "afm": lambda: AFMAttention(D, attention_dim=3),
    "afm_fixed_fields": lambda: AFMAttention(D, attention_dim=3, num_fields=F),
    "mhsa": lambda: MultiHeadSelfAttention(D, num_heads=2, layer_norm=True),
    "transformer": lambda: TransformerEncoderLayer(D, num_heads=2),
}


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_contract(name: str) -> None:
    layer = LAYERS[name]().double()
    e = emb(b=4).requires_grad_()
    out = layer(e)
    assert torch.isfinite(out).all()
    if name == "senet":
        assert out.shape == e.shape
    else:  # out_features is the last dim, or the flattened width for (B, P, D) bilinear output
        assert layer.out_features in (out.shape[-1], out[0].numel())
    # each row is computed alone
    torch.testing.assert_close(layer(e[1:2]), out[1:2])
    # TorchScript-able (serve/export), same numbers
    torch.testing.assert_close(torch.jit.script(layer)(e), out)
    # every parameter gets a gradient
    out.pow(2).sum().backward()
    assert e.grad is not None and torch.isfinite(e.grad).all() and e.grad.abs().sum() > 0
    for pname, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
    # reset_parameters is deterministic under a seed and keeps shapes
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    torch.manual_seed(1)
    layer.reset_parameters()
    a = {k: v.clone() for k, v in layer.state_dict().items()}
    torch.manual_seed(1)
    layer.reset_parameters()
    for k, v in layer.state_dict().items():
        assert v.shape == before[k].shape
        torch.testing.assert_close(v, a[k])


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_torch_export_dynamic_batch(name: str) -> None:
    layer = LAYERS[name]().eval()
    e = torch.randn(4, F, D)
    program = torch.export.export(layer, (e,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    e7 = torch.randn(7, F, D)
    torch.testing.assert_close(program.module()(e7), layer(e7))
