"""MLP against an explicit per-layer computation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ctrkit.errors import LayerConfigError
from ctrkit.nn.mlp import MLP


def test_matches_explicit_layers():
    torch.manual_seed(0)
    mlp = MLP(6, [5, 4, 3], activation="tanh", final_activation=False)
    assert mlp.out_features == 3 and mlp.in_features == 6
    x = torch.randn(7, 6)
    linears = [m for m in mlp.layers if isinstance(m, nn.Linear)]
    assert [lin.out_features for lin in linears] == [5, 4, 3]
    h = x
    for i, lin in enumerate(linears):
        h = h @ lin.weight.t() + lin.bias
        if i < 2:
            h = torch.tanh(h)
    torch.testing.assert_close(mlp(x), h)


def test_final_activation_batch_norm_dropout():
    mlp = MLP(4, [8, 2], batch_norm=True, dropout=0.5)
    kinds = [type(m).__name__ for m in mlp.layers]
    assert kinds == ["Linear", "BatchNorm1d", "ReLU", "Dropout"] * 2
    mlp.eval()
    x = torch.randn(3, 4)
    assert (mlp(x) >= 0).all()  # relu after the last layer, dropout off in eval
    h = x
    for m in mlp.layers:
        if isinstance(m, nn.Linear):
            h = h @ m.weight.t() + m.bias
        elif isinstance(m, nn.BatchNorm1d):
            h = (h - m.running_mean) / torch.sqrt(m.running_var + m.eps) * m.weight + m.bias
        elif isinstance(m, nn.ReLU):
            h = h.clamp(min=0)
    torch.testing.assert_close(mlp(x), h)


def test_empty_hidden_is_identity_and_bad_options():
    mlp = MLP(5, [])
    x = torch.randn(2, 5)
    assert mlp.out_features == 5 and torch.equal(mlp(x), x)
    with pytest.raises(LayerConfigError, match="MLP: unknown activation='relux'; valid: gelu, identity"):
        MLP(3, [2], activation="relux")
    with pytest.raises(LayerConfigError, match="positive"):
        MLP(3, [0])
    with pytest.raises(LayerConfigError, match="dropout"):
        MLP(3, [2], dropout=1.0)


def test_a_factory_gives_each_layer_its_own_module_an_instance_is_shared():
    own = MLP(3, [4, 4], activation=nn.PReLU)
    shared_act = nn.PReLU()
    shared = MLP(3, [4, 4], activation=shared_act)
    assert len(list(own.parameters())) == 4 + 2  # two Linear (weight, bias) + two PReLU slopes
    assert [m for m in shared.layers if isinstance(m, nn.PReLU)] == [shared_act, shared_act]
    assert len(list(shared.parameters())) == 4 + 1


def test_relu_in_place_keeps_values_and_gradients():
    torch.manual_seed(5)
    mlp = MLP(6, [8, 4], batch_norm=True)
    assert all(m.inplace for m in mlp.layers if isinstance(m, nn.ReLU))
    x = torch.randn(10, 6, requires_grad=True)
    out = mlp(x)
    h = x
    for m in mlp.layers:  # the same layers, out of place
        h = torch.relu(h) if isinstance(m, nn.ReLU) else m(h)
    torch.testing.assert_close(out, h)
    g = torch.randn_like(out)
    (gx,) = torch.autograd.grad(out, x, g)
    (hx,) = torch.autograd.grad(h, x, g)
    torch.testing.assert_close(gx, hx)
