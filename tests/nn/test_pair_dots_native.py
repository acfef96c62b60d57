"""DotInteraction's native training node (nn/pair_dots_native.py, csrc/pair_dots.cpp) against the torch-op node it
replaces (nn.interaction._PairDots + cat), bit for bit: outputs and the gradients of the dense and sparse rows, with
and without dense features, fp32 and fp64, odd batch sizes, one and two threads, the sparse rows as a strided view;
gradcheck; and where it does not apply (autocast, other dtypes, kernels off)."""

from __future__ import annotations

import pytest
import torch

from ctrkit.nn import interaction, kernels, pair_dots_native
from ctrkit.nn.interaction import DotInteraction

pytestmark = pytest.mark.skipif(not pair_dots_native.kernel_available(), reason="no native kernel on this machine")


def _run(layer: DotInteraction, dense, fields, weight, native: bool, monkeypatch) -> list[torch.Tensor]:
    """The output and the inputs' gradients, the sparse rows given as the (B, F, D) view of (F, B, D) fields."""
    monkeypatch.setattr(interaction, "native_pair_dots",
                        pair_dots_native.native_pair_dots if native else (lambda c, d: None))
    d = None if dense is None else dense.detach().clone().requires_grad_()
    f = fields.detach().clone().requires_grad_()
    out = layer(d, f.transpose(0, 1))
    (out * weight).sum().backward()
    return [out.detach(), f.grad] + ([] if d is None else [d.grad])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [1, 7, 130])
@pytest.mark.parametrize("with_dense", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_native_node_equals_torch_node(dtype, batch, with_dense, threads, monkeypatch):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        F, D = 5, 3
        layer = DotInteraction(F, D, with_dense=with_dense)
        g = torch.Generator().manual_seed(batch)
        dense = torch.randn(batch, D, generator=g, dtype=dtype) if with_dense else None
        fields = torch.randn(F, batch, D, generator=g, dtype=dtype)
        weight = torch.randn(batch, layer.out_features, generator=g, dtype=dtype)
        native = _run(layer, dense, fields, weight, True, monkeypatch)
        plain = _run(layer, dense, fields, weight, False, monkeypatch)
    finally:
        torch.set_num_threads(before)
    assert len(native) == len(plain) and all(torch.equal(a, b) for a, b in zip(native, plain))


def test_column_major_gradient(monkeypatch):
    """The top MLP hands back a column-major gradient for an odd width: read where it lies, same floats."""
    layer = DotInteraction(6, 4)
    dense, fields = torch.randn(33, 4), torch.randn(6, 33, 4)
    grad = torch.randn(layer.out_features, 33).t()  # (B, N) column-major
    res = []
    for native in (True, False):
        monkeypatch.setattr(interaction, "native_pair_dots",
                            pair_dots_native.native_pair_dots if native else (lambda c, d: None))
        d, f = dense.clone().requires_grad_(), fields.clone().requires_grad_()
        layer(d, f.transpose(0, 1)).backward(grad)
        res.append((d.grad, f.grad))
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])


def test_the_native_node_runs_in_training_only():
    layer = DotInteraction(4, 2)
    dense, sparse = torch.randn(3, 2, requires_grad=True), torch.randn(3, 4, 2, requires_grad=True)
    assert type(layer(dense, sparse).grad_fn).__name__ == "_PairDotsNativeBackward"
    with torch.no_grad():
        assert layer(dense, sparse).grad_fn is None


def test_gradcheck():
    c = torch.randn(4, 5, 3, dtype=torch.float64, requires_grad=True)
    d = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda c, d: pair_dots_native._PairDotsNative.apply(c, d), (c, d))
    assert torch.autograd.gradcheck(lambda c: pair_dots_native._PairDotsNative.apply(c, None), (c,))


def test_where_it_does_not_apply(monkeypatch):
    c, d = torch.randn(2, 3, 4), torch.randn(2, 4)
    assert pair_dots_native.native_pair_dots(c, d) is not None
    assert pair_dots_native.native_pair_dots(c.bfloat16(), d.bfloat16()) is None
    assert pair_dots_native.native_pair_dots(c, d.double()) is None
    assert pair_dots_native.native_pair_dots(c.to("meta"), d.to("meta")) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert pair_dots_native.native_pair_dots(c, d) is None
    monkeypatch.setenv("CTRKIT_NATIVE_KERNELS", "0")
    assert pair_dots_native.native_pair_dots(c, d) is None


def test_bind_gives_each_role_per_dtype_with_its_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    """kernels.bind: one function per role and dtype suffix, named <C name>_<suffix>, with the given C signature;
    None where kernels are off."""
    p, i64 = kernels.PTR, kernels.I64
    symbols = {"fwd": ("ctrkit_pairs_forward", [p, i64, p, i64, p, i64, i64, kernels.I32], None)}
    fns = kernels.bind("pair_dots", symbols)
    assert fns is not None and sorted(fns) == ["fwd_f32", "fwd_f64"]
    assert fns["fwd_f64"].__name__ == "ctrkit_pairs_forward_f64" and fns["fwd_f32"].argtypes[-1] is kernels.I32
    with pytest.raises(AttributeError):
        kernels.bind("pair_dots", {"x": ("ctrkit_no_such_entry", [], None)})
    monkeypatch.setenv("CTRKIT_NATIVE_KERNELS", "0")
    assert kernels.bind("pair_dots", symbols) is None
