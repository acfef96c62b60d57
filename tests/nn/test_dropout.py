"""ctrkit's Dropout against its definition: y = x * m / (1 - p), m ~ Bernoulli(1 - p), identity in eval."""

from __future__ import annotations

import math

import pytest
import torch

from ctrkit.errors import LayerConfigError
from ctrkit.nn.dropout import Dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_values_are_zero_or_scaled_input_at_the_keep_rate(p):
    torch.manual_seed(0)
    x = torch.rand(400, 500) + 0.5  # no zeros of its own
    y = Dropout(p).train()(x)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / (1 - p))
    n = x.numel()
    rate = kept.float().mean().item()
    assert abs(rate - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)  # binomial: within 5 standard errors
    assert abs(y.mean().item() - x.mean().item()) < 0.01 * x.mean().item()  # unbiased scale


def test_mask_is_independent_across_elements_and_calls():
    torch.manual_seed(1)
    d = Dropout(0.5).train()
    x = torch.ones(200_000)
    a, b = d(x) != 0, d(x) != 0
    assert not torch.equal(a, b)
    both = (a & b).float().mean().item()  # independent: 1/4
    assert abs(both - 0.25) < 0.01
    neighbours = (a[:-1] & a[1:]).float().mean().item()  # adjacent elements independent too
    assert abs(neighbours - 0.25) < 0.01


def test_gradient_is_the_same_mask():
    torch.manual_seed(2)
    x = torch.randn(64, 32, requires_grad=True)
    g = torch.randn(64, 32)
    y = Dropout(0.3).train()(x)
    y.backward(g)
    mask = (y.detach() / x.detach()).nan_to_num()  # 1 / (1 - p) or 0 per element
    torch.testing.assert_close(x.grad, g * mask)


def test_follows_torch_seed_and_rng_state():
    d = Dropout(0.2).train()
    x = torch.randn(1000)
    torch.manual_seed(3)
    a = d(x)
    state = torch.get_rng_state()
    b = d(x)
    torch.manual_seed(3)
    assert torch.equal(d(x), a)
    torch.set_rng_state(state)
    assert torch.equal(d(x), b)


def test_eval_zero_p_dtype_and_options():
    x = torch.randn(8, 4)
    assert Dropout(0.5).eval()(x) is x
    assert Dropout(0.0).train()(x) is x
    torch.manual_seed(4)  # other dtypes: torch's own dropout, draw for draw
    y = Dropout(0.5).train()(x.double())
    torch.manual_seed(4)
    assert torch.equal(y, torch.nn.functional.dropout(x.double(), 0.5, True))
    with pytest.raises(LayerConfigError, match="Dropout p"):
        Dropout(1.0)
    with pytest.raises(LayerConfigError, match="Dropout p"):
        Dropout(-0.1)


def test_scripts():  # TorchScript: torch's mask in training, the identity in eval
    d = torch.jit.script(Dropout(0.25))
    x = torch.ones(10_000)
    y = d.train()(x)
    assert all(v == 0.0 or v == pytest.approx(1 / 0.75) for v in y.unique().tolist())
    assert torch.equal(d.eval()(x), x)
