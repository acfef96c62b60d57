"""FiBiNET's fused field_interaction node (nn/bilinear_pairs.py) against loops over the pairs and the plain layer."""

from __future__ import annotations

import pytest
import torch

from ctrkit.errors import LayerConfigError
from ctrkit.nn.bilinear_pairs import bilinear_pairs_concat, bilinear_pairs_shared
from ctrkit.nn.fm import pair_blocks, pair_indices
from ctrkit.nn.senet import BilinearInteraction, bilinear_concat, bilinear_shared_concat

B, D = 5, 4


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def loop_reference(emb: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """p_ij = (v_i W_ij) ⊙ v_j for i < j in upper-triangle order, each an einsum -> (B, P*D)."""
    f = emb.shape[1]
    pairs = [(i, j) for i in range(f) for j in range(i + 1, f)]
    out = [torch.einsum("bd,de->be", emb[:, i], weight[n]) * emb[:, j] for n, (i, j) in enumerate(pairs)]
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("num_fields", [2, 3, 7])
@pytest.mark.parametrize("tail_width", [None, 0, 3])
def test_values_and_gradients_equal_the_loops(num_fields: int, tail_width: int | None) -> None:
    layers = [BilinearInteraction(num_fields, D).double() for _ in range(2)]
    embs = [torch.randn(B, num_fields, D, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    tail = None if tail_width is None else torch.randn(B, tail_width, dtype=torch.float64, requires_grad=True)
    weights = [layer.weight for layer in layers]
    got = bilinear_pairs_concat(embs, weights, tail)
    parts = [loop_reference(e, w) for e, w in zip(embs, weights)]
    want = torch.cat(parts if tail is None else [*parts, tail], dim=1)
    torch.testing.assert_close(got, want)
    upstream = torch.randn_like(want)
    inputs = [*embs, *weights, *([tail] if tail is not None and tail_width else [])]
    g_got = torch.autograd.grad(got, inputs, upstream)
    g_want = torch.autograd.grad(want, inputs, upstream)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b)


def test_gradcheck() -> None:
    f = 4
    emb = torch.randn(3, f, 2, dtype=torch.float64, requires_grad=True)
    emb2 = torch.randn(3, f, 2, dtype=torch.float64, requires_grad=True)
    w = torch.randn(f * (f - 1) // 2, 2, 2, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn_like(w, requires_grad=True)
    tail = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c, d, t: bilinear_pairs_concat([a, b], [c, d], t),
                                    (emb, emb2, w, w2, tail))


def test_float32_forward_is_the_plain_layers_bit_for_bit() -> None:
    """Same products in the same order: the fused node's forward equals the plain layers' (not just closely)."""
    layers = [BilinearInteraction(9, 16) for _ in range(2)]
    embs = [torch.randn(64, 9, 16), torch.randn(64, 9, 16).transpose(0, 1).contiguous().transpose(0, 1)]
    dense = torch.randn(64, 1)
    plain = torch.cat([layers[0](embs[0]).flatten(1), layers[1](embs[1]).flatten(1), dense], dim=1)
    assert torch.equal(bilinear_concat(layers, embs, dense), plain)


def test_only_grads_asked_for() -> None:
    layer = BilinearInteraction(3, D)
    layer.weight.requires_grad_(False)
    emb = torch.randn(B, 3, D, requires_grad=True)
    out = bilinear_pairs_concat([emb], [layer.weight])
    out.sum().backward()
    assert emb.grad is not None and layer.weight.grad is None


@pytest.mark.parametrize("bilinear_type", ["field_all", "field_each"])
def test_other_types_take_the_plain_path(bilinear_type: str) -> None:
    layers = [BilinearInteraction(4, D, bilinear_type=bilinear_type) for _ in range(2)]
    embs = [torch.randn(B, 4, D) for _ in range(2)]
    want = torch.cat([layers[0](embs[0]).flatten(1), layers[1](embs[1]).flatten(1)], dim=1)
    assert torch.equal(bilinear_concat(layers, embs), want)


def test_mismatched_lists_and_shapes_are_errors() -> None:
    with pytest.raises(LayerConfigError, match="one weight per embedding"):
        bilinear_pairs_concat([torch.randn(B, 3, D)], [])
    layer = BilinearInteraction(3, D)
    with pytest.raises(LayerConfigError, match="BilinearInteraction"):
        bilinear_concat([layer], [torch.randn(B, 4, D)])


def test_output_is_a_transposed_view_and_a_matmul_hands_back_its_gradient_in_place() -> None:
    """The layout contract: X is the (B, N) view of a contiguous X^T, and the next Linear's backward returns dX in
    the same transposed layout (torch's matmul backward keeps a transposed input's layout), so no copy is made."""
    embs = [torch.randn(6, 4, D, requires_grad=True) for _ in range(2)]
    weights = [torch.randn(6, D, D, requires_grad=True) for _ in range(2)]
    x = bilinear_pairs_concat(embs, weights, torch.randn(6, 2))
    assert x.shape == (6, 2 * 6 * D + 2) and x.t().is_contiguous()
    seen = []
    x.register_hook(lambda g: seen.append(g.t().is_contiguous()))
    torch.nn.Linear(x.shape[1], 3)(x).sum().backward()
    assert seen == [True]


def shared_reference(layer: BilinearInteraction, emb: torch.Tensor, scale: torch.Tensor,
                     tail: torch.Tensor | None) -> torch.Tensor:
    """The definition: the same layer on the raw and on the re-weighted embeddings, concatenated."""
    parts = [layer(emb).flatten(1), layer(emb * scale.unsqueeze(2)).flatten(1)]
    return torch.cat(parts if tail is None else [*parts, tail], dim=1)


@pytest.mark.parametrize("bilinear_type", ["field_all", "field_each", "field_interaction"])
@pytest.mark.parametrize("num_fields", [2, 5])
@pytest.mark.parametrize("tail_width", [None, 3])
def test_shared_layer_values_and_gradients_equal_the_definition(bilinear_type: str, num_fields: int,
                                                                tail_width: int | None) -> None:
    layer = BilinearInteraction(num_fields, D, bilinear_type=bilinear_type).double()
    emb = torch.randn(B, num_fields, D, dtype=torch.float64, requires_grad=True)
    scale = torch.rand(B, num_fields, dtype=torch.float64, requires_grad=True)
    tail = None if tail_width is None else torch.randn(B, tail_width, dtype=torch.float64, requires_grad=True)
    got = bilinear_shared_concat(layer, emb, scale, tail)
    want = shared_reference(layer, emb, scale, tail)
    torch.testing.assert_close(got, want)
    upstream = torch.randn_like(want)
    inputs = [emb, scale, layer.weight, *([tail] if tail is not None else [])]
    for a, b in zip(torch.autograd.grad(got, inputs, upstream), torch.autograd.grad(want, inputs, upstream)):
        torch.testing.assert_close(a, b)


def test_shared_node_gradcheck() -> None:
    f = 4
    emb = torch.randn(3, f, 2, dtype=torch.float64, requires_grad=True)
    scale = torch.rand(3, f, dtype=torch.float64, requires_grad=True)
    w = torch.randn(f * (f - 1) // 2, 2, 2, dtype=torch.float64, requires_grad=True)
    tail = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(bilinear_pairs_shared, (emb, scale, w, tail))


def test_shared_scale_of_the_wrong_shape_is_an_error() -> None:
    layer = BilinearInteraction(3, D)
    with pytest.raises(LayerConfigError, match=r"scale must be \(B, F\) = \(5, 3\), got \(5, 4\)"):
        bilinear_shared_concat(layer, torch.randn(B, 3, D), torch.rand(B, 4))


@pytest.mark.parametrize("num_fields", [2, 3, 9, 26])
def test_pair_blocks_cover_the_pairs_in_pair_indices_order(num_fields: int) -> None:
    """The left-field blocks the pair nodes (bilinear, AFM) loop over are runs of :func:`pair_indices`."""
    rows, cols = pair_indices(num_fields)
    covered = 0
    for i, s, k in pair_blocks(num_fields):
        assert s == covered and k == num_fields - 1 - i
        assert torch.equal(rows[s:s + k], torch.full((k,), i)) and torch.equal(cols[s:s + k], torch.arange(i + 1, num_fields))
        covered += k
    assert covered == len(rows)
