"""FiBiNET's shared bilinear node as a native kernel (nn/bilinear_pairs_native.py, csrc/bilinear_pairs.cpp) against
the torch-op node, the definition (the same layer on the raw and the re-weighted fields) and gradcheck."""

from __future__ import annotations

import pytest
import torch

from ctrkit.nn import bilinear_pairs_native as native
from ctrkit.nn.bilinear_pairs import bilinear_pairs_shared
from ctrkit.nn.senet import SENET, BilinearInteraction, bilinear_shared_concat, senet_bilinear_shared_concat

pytestmark = pytest.mark.skipif(not native.kernel_available(), reason="no C++ compiler: the kernel cannot be built")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def inputs(b: int, f: int, d: int, dtype: torch.dtype, tail: int | None = 2):
    emb = torch.randn(f, b, d, dtype=dtype).transpose(0, 1).requires_grad_()  # (B, F, D) view, as FiBiNET hands it
    scale = torch.rand(b, f, dtype=dtype, requires_grad=True)
    weight = (torch.randn(f * (f - 1) // 2, d, d, dtype=dtype) * d**-0.5).requires_grad_()
    dense = None if tail is None else torch.randn(b, tail, dtype=dtype, requires_grad=True)
    return emb, scale, weight, dense


def definition(emb, scale, weight, dense):
    """[flat p | flat q | dense] with p_ij = (v_i W_ij) ⊙ v_j and q the same on v'_i = a_i v_i, pair by pair."""
    f = emb.shape[1]
    pairs = [(i, j) for i in range(f) for j in range(i + 1, f)]
    re = emb * scale.unsqueeze(2)
    p = [torch.einsum("bd,de->be", emb[:, i], weight[n]) * emb[:, j] for n, (i, j) in enumerate(pairs)]
    q = [torch.einsum("bd,de->be", re[:, i], weight[n]) * re[:, j] for n, (i, j) in enumerate(pairs)]
    return torch.cat([*p, *q, *([] if dense is None else [dense])], dim=1)


def values_and_grads(fn, args, upstream):
    out = fn(*args)
    wanted = [a for a in args if a is not None]
    return out, torch.autograd.grad(out, wanted, upstream)


# B: under one vector, one vector and a tail, whole vectors; D: the compiled 8 and 16 and the generic path
@pytest.mark.parametrize("b, f, d", [(1, 2, 4), (5, 3, 8), (37, 9, 16), (64, 4, 5), (19, 6, 20)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("tail", [None, 3])
def test_kernel_equals_the_definition_and_the_torch_node(b, f, d, dtype, tail) -> None:
    args = inputs(b, f, d, dtype, tail)
    assert native.applies(*args[:3])
    upstream = torch.randn(b, f * (f - 1) * d + (tail or 0), dtype=dtype)
    got, g_got = values_and_grads(lambda *a: bilinear_pairs_shared(*a), args, upstream)
    assert got.grad_fn.name() == "_NativeSharedPairsBackward"
    want, g_want = values_and_grads(definition, args, upstream)
    node, g_node = values_and_grads(lambda *a: bilinear_pairs_shared(*a, native=False), args, upstream)
    assert node.grad_fn.name() == "_SharedBilinearPairsBackward"
    tol = {} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(got, node, **tol)
    for a, w, n in zip(g_got, g_want, g_node):
        torch.testing.assert_close(a, w, **tol)
        torch.testing.assert_close(a, n, **tol)


def test_gradcheck() -> None:
    emb, scale, weight, dense = inputs(19, 4, 3, torch.float64)  # 19: two vectors of 8 doubles and a tail of 3
    assert torch.autograd.gradcheck(lambda *a: bilinear_pairs_shared(*a), (emb, scale, weight, dense))


def test_the_model_layer_runs_the_kernel_and_matches_the_definition() -> None:
    layer = BilinearInteraction(5, 8)
    emb, scale, _, dense = inputs(33, 5, 8, torch.float32)
    out = bilinear_shared_concat(layer, emb, scale, dense)
    assert out.grad_fn.name() == "_NativeSharedPairsBackward"
    torch.testing.assert_close(out, definition(emb, scale, layer.weight, dense), rtol=1e-5, atol=1e-6)


def test_two_threads_give_the_same_result() -> None:
    """Threads split the samples; only dW's sum over samples changes order (per-thread partial sums)."""
    args = inputs(301, 5, 16, torch.float32)
    upstream = torch.randn(301, 5 * 4 * 16 + 2)
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(values_and_grads(lambda *a: bilinear_pairs_shared(*a), args, upstream))
    finally:
        torch.set_num_threads(before)
    (o1, g1), (o2, g2) = outs
    assert torch.equal(o1, o2)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_which_path_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel on CPU float32 / float64 with D <= 64; the torch-op node for other dtypes, D > 64, mixed dtypes
    and with CTRKIT_NATIVE_KERNELS=0 (the same function either way)."""
    emb, scale, weight, dense = inputs(8, 3, 4, torch.float32)
    assert native.native_shared_pairs(emb, scale, weight, dense) is not None
    assert native.native_shared_pairs(emb.bfloat16(), scale.bfloat16(), weight.bfloat16(), None) is None
    assert native.native_shared_pairs(emb, scale.double(), weight, None) is None
    big = inputs(2, 3, 65, torch.float32)
    assert native.native_shared_pairs(*big) is None
    assert bilinear_pairs_shared(*big).grad_fn.name() == "_SharedBilinearPairsBackward"
    with_kernel = bilinear_pairs_shared(emb, scale, weight, dense)
    monkeypatch.setenv("CTRKIT_NATIVE_KERNELS", "0")
    assert native.native_shared_pairs(emb, scale, weight, dense) is None
    off = bilinear_pairs_shared(emb, scale, weight, dense)
    assert off.grad_fn.name() == "_SharedBilinearPairsBackward"
    torch.testing.assert_close(off, with_kernel)


def test_output_is_a_transposed_view_and_the_first_linear_hands_back_its_gradient_without_a_copy() -> None:
    emb, scale, weight, dense = inputs(40, 4, 8, torch.float32)
    x = bilinear_pairs_shared(emb, scale, weight, dense)
    assert x.t().is_contiguous()
    seen = []
    x.register_hook(lambda g: seen.append(g.t().is_contiguous()))
    torch.nn.Linear(x.shape[1], 3)(x).sum().backward()
    assert seen == [True] and emb.grad is not None and scale.grad is not None and weight.grad is not None


@pytest.mark.parametrize("b, f, d, ratio", [(37, 9, 16, 3.0), (5, 4, 3, 1.0), (48, 26, 16, 3.0), (3, 2, 8, 3.0)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_senet_in_the_node_equals_the_modules(b, f, d, ratio, dtype) -> None:
    """SENET's excitation computed in the node's kernels: the same values and gradients (emb, W1, W2, W) as SENET's
    field_weights fed to the shared layer."""
    senet, layer = SENET(f, reduction_ratio=ratio).to(dtype), BilinearInteraction(f, d).to(dtype)
    emb, _, _, dense = inputs(b, f, d, dtype)
    got = senet_bilinear_shared_concat(senet, layer, emb, dense)
    assert got.grad_fn.name() == "_NativeSenetSharedPairsBackward"
    want = bilinear_shared_concat(layer, emb, senet.field_weights(emb), dense)
    upstream = torch.randn_like(want)
    params = [emb, senet.excite[0].weight, senet.excite[2].weight, layer.weight, dense]
    tol = {} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(got, want, **tol)
    for a, w in zip(torch.autograd.grad(got, params, upstream), torch.autograd.grad(want, params, upstream)):
        torch.testing.assert_close(a, w, **tol)


def test_senet_in_the_node_gradcheck() -> None:
    senet, layer = SENET(4, reduction_ratio=2.0).double(), BilinearInteraction(4, 3).double()
    with torch.no_grad():  # weights away from the ReLUs' kinks at 0 for the finite differences
        senet.excite[0].weight.abs_().add_(0.1)
        senet.excite[2].weight.abs_().add_(0.1)
    emb, _, _, dense = inputs(19, 4, 3, torch.float64)
    with torch.no_grad():
        emb.abs_()
    params = (emb, senet.excite[0].weight, senet.excite[2].weight, layer.weight, dense)

    def fn(e, w1, w2, w, t):
        return native.native_senet_shared_pairs(e, w1, w2, w, t)

    assert torch.autograd.gradcheck(fn, params)


def test_senet_with_max_pooling_or_kernels_off_takes_the_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = BilinearInteraction(5, 4)
    emb, _, _, dense = inputs(10, 5, 4, torch.float32)
    mean, top = SENET(5), SENET(5, pooling="max")
    assert senet_bilinear_shared_concat(top, layer, emb, dense).grad_fn.name() == "_NativeSharedPairsBackward"
    with_kernel = senet_bilinear_shared_concat(mean, layer, emb, dense)
    monkeypatch.setenv("CTRKIT_NATIVE_KERNELS", "0")
    off = senet_bilinear_shared_concat(mean, layer, emb, dense)
    assert off.grad_fn.name() == "_SharedBilinearPairsBackward"
    torch.testing.assert_close(off, with_kernel, rtol=1e-5, atol=1e-6)
