"""DIN's layers (Dice, TargetAttention, masked pooling, mini-batch-aware L2) against naive references:
manual BatchNorm statistics, per-row / per-position loops, the concatenated [q, k, q − k, q ⊙ k] input."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from ctrkit.errors import LayerConfigError
from ctrkit.nn.activation import make_activation
from ctrkit.nn.mlp import MLP
from ctrkit.nn.sequence import Dice, TargetAttention, masked_mean, masked_sum, mba_l2

B, T, D = 4, 6, 3
LENGTHS = [6, 2, 0, 4]  # one full row, one empty history


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def lengths_mask(lengths: list[int], t: int = T) -> torch.Tensor:
    return torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # (B, T) right-padded


def dice_reference(s: torch.Tensor, alpha: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, eps: float):
    p = torch.sigmoid((s - mean) / torch.sqrt(var + eps))
    return p * s + (1 - p) * alpha * s


# ---- Dice -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7, 3), (2, 5, 3)])
def test_dice_train_uses_batch_statistics_and_updates_running_ones(shape) -> None:
    dice = Dice(3, eps=1e-5, momentum=0.25).double()
    with torch.no_grad():
        dice.alpha.copy_(torch.tensor([0.0, 0.3, -0.7]))
    s = torch.randn(*shape, dtype=torch.float64) * 2 + 1
    flat = s.reshape(-1, 3)
    mean, var = flat.mean(0), flat.var(0, unbiased=False)  # biased batch variance normalises
    torch.testing.assert_close(dice(s), dice_reference(s, dice.alpha, mean, var, 1e-5))
    n = flat.shape[0]
    torch.testing.assert_close(dice.running_mean, 0.75 * torch.zeros(3, dtype=torch.float64) + 0.25 * mean)
    torch.testing.assert_close(dice.running_var, 0.75 * torch.ones(3, dtype=torch.float64) + 0.25 * var * n / (n - 1))


def test_dice_eval_uses_running_statistics() -> None:
    dice = Dice(3).double()
    with torch.no_grad():
        dice.alpha.uniform_(-1, 1)
        dice.running_mean.copy_(torch.tensor([0.5, -1.0, 2.0]))
        dice.running_var.copy_(torch.tensor([0.3, 2.0, 1.0]))
    dice.eval()
    s = torch.randn(2, 4, 3, dtype=torch.float64)
    out = dice(s)
    torch.testing.assert_close(out, dice_reference(s, dice.alpha, dice.running_mean, dice.running_var, 1e-8))
    torch.testing.assert_close(dice(s[:1, :1]), out[:1, :1])  # per element in eval: any batch size
    assert torch.equal(dice.running_mean, torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64))


def test_dice_limits_single_row_and_gradients() -> None:
    dice = Dice(2).double()
    s = torch.tensor([[3.0, -2.0]], dtype=torch.float64)
    torch.testing.assert_close(dice(s), 0.5 * s)  # one row: standardised to 0, p = 1/2, α = 0
    assert torch.equal(dice.running_var, torch.ones(2, dtype=torch.float64))  # left alone
    with torch.no_grad():
        dice.alpha.fill_(1.0)
    x = torch.randn(5, 2, dtype=torch.float64)
    torch.testing.assert_close(dice(x), x)  # α = 1: identity whatever p
    frozen = Dice(2, momentum=0.0).double()  # gradcheck's repeated calls leave the running stats alone
    with torch.no_grad():
        frozen.alpha.copy_(torch.tensor([0.2, -0.4]))
    assert torch.autograd.gradcheck(frozen, (torch.randn(6, 2, dtype=torch.float64, requires_grad=True),))


def test_dice_through_make_activation_and_mlp() -> None:
    assert isinstance(make_activation("Dice", num_features=4), Dice)
    with pytest.raises(LayerConfigError, match="MyLayer: activation='dice' needs num_features"):
        make_activation("dice", layer="MyLayer")
    with pytest.raises(LayerConfigError, match="valid: gelu, .*, dice"):
        make_activation("nope")
    mlp = MLP(5, [4, 3], activation="dice")
    assert [m.num_features for m in mlp.layers if isinstance(m, Dice)] == [4, 3]
    assert mlp(torch.randn(8, 5)).shape == (8, 3)
    assert isinstance(make_activation("relu", num_features=4), nn.ReLU)  # unsized names ignore the width
    with pytest.raises(LayerConfigError, match=r"Dice: input must be \(..., 3\)"):
        Dice(3)(torch.randn(4, 2))
    with pytest.raises(LayerConfigError, match="num_features"):
        Dice(0)


# ---- masked pooling, mini-batch-aware L2 ----------------------------------------------------------------


def test_masked_sum_and_mean_against_loops() -> None:
    x = torch.randn(B, T, D, dtype=torch.float64, requires_grad=True)
    mask = lengths_mask(LENGTHS)
    total, mean = masked_sum(x, mask), masked_mean(x, mask)
    for b, n in enumerate(LENGTHS):
        ref = sum((x[b, t] for t in range(n)), torch.zeros(D, dtype=torch.float64))
        torch.testing.assert_close(total[b], ref)
        torch.testing.assert_close(mean[b], ref / n if n else torch.zeros(D, dtype=torch.float64))
    (total.sum() + mean.sum()).backward()
    assert (x.grad[~mask] == 0).all() and (x.grad[mask] != 0).all()
    with pytest.raises(LayerConfigError, match="masked_sum: mask must have shape"):
        masked_sum(x, mask[:, :2])


def test_mba_l2_against_a_loop() -> None:
    weight = torch.randn(10, 3, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[3, 3, 0, 7], [7, 9, 0, 0], [1, 3, 9, 9]])
    counts = torch.tensor([5.0, 4.0, 0.0, 2.0, 1.0, 1.0, 1.0, 0.0, 1.0, 3.0])
    loss = mba_l2(weight, ids, counts, 0.1)
    present = {int(i) for i in ids.flatten()} - {0}
    ref = sum(weight[j].pow(2).sum() / max(float(counts[j]), 1.0) for j in present)
    torch.testing.assert_close(loss, 0.1 * ref)
    loss.backward()
    for j in range(10):
        expect = 0.2 * weight[j] / max(float(counts[j]), 1.0) if j in present else torch.zeros(3, dtype=torch.float64)
        torch.testing.assert_close(weight.grad[j], expect.detach())
    by_lookup = mba_l2(lambda i: weight.index_select(0, i), ids, counts, 0.1)  # a table's lookup, any backend
    torch.testing.assert_close(by_lookup, 0.1 * ref)
    plain = mba_l2(weight, ids, None, 1.0)
    torch.testing.assert_close(plain, sum(weight[j].pow(2).sum() for j in present))
    assert mba_l2(weight, torch.zeros(2, 2, dtype=torch.long), counts, 1.0).item() == 0.0  # all padding
    with pytest.raises(LayerConfigError, match="counts must be"):
        mba_l2(weight, ids, counts[:3], 1.0)


# ---- TargetAttention --------------------------------------------------------------------------------


def unit_reference(att: TargetAttention, x: torch.Tensor) -> torch.Tensor:
    """The unit on concatenated inputs x (N, 4D), layer by layer: -> (N,)."""
    h = att.first(x)
    if att.first_activation is not None:
        h = att.out(att.mlp(att.first_activation(h)))
    return h.squeeze(-1)


@torch.no_grad()
def attention_loop(att: TargetAttention, q, k, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, per real position (valid when the unit has no batch statistics: any non-Dice activation, or
    eval): the weights (B, T) and pooled (B, D)."""
    b, t, d = k.shape
    weights = torch.zeros(b, t, dtype=k.dtype)
    pooled = torch.zeros(b, d, dtype=k.dtype)
    for i in range(b):
        real = [j for j in range(t) if mask[i, j]]
        a = {j: unit_reference(att, torch.cat([q[i], k[i, j], q[i] - k[i, j], q[i] * k[i, j]])[None])[0]
             for j in real}
        if att.normalize and real:
            top = max(float(v) for v in a.values())
            z = sum(math.exp(float(v) - top) for v in a.values())
            a = {j: math.exp(float(v) - top) / z for j, v in a.items()}
        for j in real:
            weights[i, j] = float(a[j])
            pooled[i] += float(a[j]) * k[i, j]
    return weights, pooled


def inputs(b: int = B, t: int = T, d: int = D, lengths: list[int] = LENGTHS):
    q = torch.randn(b, d, dtype=torch.float64)
    k = torch.randn(b, t, d, dtype=torch.float64)
    return q, k, lengths_mask(lengths, t)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("activation, hidden", [("sigmoid", (5, 4)), ("prelu", (5,)), ("relu", ())])
def test_target_attention_against_a_per_row_loop(normalize, activation, hidden) -> None:
    att = TargetAttention(D, hidden=hidden, activation=activation, normalize=normalize, return_scores=True).double()
    q, k, mask = inputs()
    pooled, w = att(q, k, mask)
    ref_w, ref_pooled = attention_loop(att, q, k, mask)
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(pooled, ref_pooled)
    assert att.out_features == D
    torch.testing.assert_close(att.scores(q, k, mask), w)
    if normalize:  # weights of a non-empty row sum to 1, of the empty row to 0
        torch.testing.assert_close(w.sum(1), torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64))


def test_target_attention_dice_in_eval_against_the_loop() -> None:
    att = TargetAttention(D, hidden=(6, 4)).double()  # default activation: Dice
    for m in att.modules():
        if isinstance(m, Dice):
            with torch.no_grad():
                m.alpha.uniform_(-1, 1)
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
    att.eval()
    q, k, mask = inputs()
    ref_w, ref_pooled = attention_loop(att, q, k, mask)
    torch.testing.assert_close(att.scores(q, k, mask), ref_w)
    torch.testing.assert_close(att(q, k, mask), ref_pooled)


def test_target_attention_split_first_layer_equals_the_concatenated_input_in_training() -> None:
    """With Dice in training the statistics are over the batch's real positions: the whole unit on the
    stacked concatenations of every real (row, position) equals the split-weight evaluation."""
    att = TargetAttention(D, hidden=(6, 4)).double().train()
    q, k, mask = inputs()
    rows, cols = mask.nonzero(as_tuple=True)
    x = torch.cat([q[rows], k[rows, cols], q[rows] - k[rows, cols], q[rows] * k[rows, cols]], dim=1)  # (n, 4D)
    expect = torch.zeros(B, T, dtype=torch.float64)
    expect[rows, cols] = unit_reference(att, x)
    torch.testing.assert_close(att.logits(q, k, mask), expect)
    torch.testing.assert_close(att(q, k, mask), torch.einsum("bt,btd->bd", expect, k))


@pytest.mark.parametrize("normalize", [False, True])
def test_target_attention_padding_and_empty_rows(normalize) -> None:
    att = TargetAttention(D, hidden=(6,), normalize=normalize).double().train()  # Dice, batch statistics
    q, k, mask = inputs()
    k.requires_grad_(True)
    pooled = att(q, k, mask)
    moved = k.detach().clone()
    moved[~mask] = 100.0  # padding values change neither Dice's statistics nor any output
    torch.testing.assert_close(att(q, moved, mask), pooled.detach())
    pooled.sum().backward()
    assert (k.grad[~mask] == 0).all() and torch.isfinite(k.grad).all()
    assert torch.equal(pooled[2], torch.zeros(D, dtype=torch.float64))  # empty history
    q2 = q.clone().requires_grad_(True)
    none = torch.zeros(B, T, dtype=torch.bool)  # every row empty
    out = att(q2, k.detach(), none)
    assert torch.equal(out, torch.zeros(B, D, dtype=torch.float64))
    assert torch.equal(att.scores(q, k, none), torch.zeros(B, T, dtype=torch.float64))


def test_target_attention_one_real_position_in_training() -> None:
    att = TargetAttention(D, hidden=(4,)).double().train()
    q, k, mask = inputs(lengths=[1, 0, 0, 0])
    out = att(q, k, mask)  # Dice sees a single row: p = 1/2, no error
    assert torch.isfinite(out).all() and torch.equal(out[1:], torch.zeros(3, D, dtype=torch.float64))


@pytest.mark.parametrize("activation", ["sigmoid", "dice"])
@pytest.mark.parametrize("normalize", [False, True])
def test_target_attention_gradcheck(activation, normalize) -> None:
    att = TargetAttention(2, hidden=(3, 2), activation=activation, normalize=normalize).double()
    q = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    k = torch.randn(3, 4, 2, dtype=torch.float64, requires_grad=True)
    mask = lengths_mask([4, 2, 0], 4)
    assert torch.autograd.gradcheck(lambda q_, k_: att(q_, k_, mask), (q, k))


def test_target_attention_mask_none_and_bad_arguments() -> None:
    att = TargetAttention(D, hidden=(4,), activation="tanh").double()
    q, k, _ = inputs()
    torch.testing.assert_close(att(q, k), att(q, k, torch.ones(B, T, dtype=torch.bool)))
    with pytest.raises(LayerConfigError, match="query_dim and key_dim must be equal"):
        TargetAttention(4, 5)
    with pytest.raises(LayerConfigError, match="hidden widths"):
        TargetAttention(4, hidden=(0,))
    with pytest.raises(LayerConfigError, match="TargetAttention: need q"):
        att(q[:, :2], k)
    with pytest.raises(LayerConfigError, match="TargetAttention: mask must have shape"):
        att(q, k, torch.ones(B, T + 1, dtype=torch.bool))
    with pytest.raises(LayerConfigError, match="TargetAttention: unknown activation"):
        TargetAttention(4, activation="nope")
