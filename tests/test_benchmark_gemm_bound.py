"""benchmarks/dlrm_gemm_bound.py: its recorder sees every GEMM of a training step with the layout autograd uses, its
FLOP count equals torch's counter, and a replayed call computes what the recorded one did."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import benchmark_module
from torch.utils.flop_counter import FlopCounterMode


@pytest.fixture(autouse=True)
def _benchmarks_on_path(monkeypatch):
    """The script imports its siblings (_roof, dlrm_throughput) as a script run from benchmarks/ would."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))


def _step(model: torch.nn.Module, x: torch.Tensor) -> None:
    model(x).square().sum().backward()


def test_recorder_sees_every_gemm_and_counts_torchs_flops():
    gb = benchmark_module("dlrm_gemm_bound")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(13, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    x = torch.randn(64, 13)
    with gb.GemmRecorder() as rec:
        _step(model, x)
    # forward: two addmm; backward: dW for both layers, dX only for the second (the input needs no gradient)
    assert [n for n, _ in rec.calls].count("addmm") == 2 and len(rec.calls) == 5
    with FlopCounterMode(display=False) as counter:
        _step(model, x)
    assert sum(gb.gemm_flops(n, ops) for n, ops in rec.calls) == counter.get_total_flops()
    transposed = [ops for _, ops in rec.calls if any(st[0] < st[-1] for _, st, _ in ops if len(st) == 2)]
    assert transposed, "autograd's transposed operands must be recorded with their strides"


def test_bmm_flops_and_replay_layout():
    gb = benchmark_module("dlrm_gemm_bound")
    a = torch.randn(5, 3, 4)
    b = torch.randn(5, 6, 4).transpose(1, 2)  # a strided (non-contiguous) operand
    with gb.GemmRecorder() as rec:
        torch.bmm(a, b)
    (name, ops), = rec.calls
    assert name == "bmm" and gb.gemm_flops(name, ops) == 2 * 5 * 3 * 4 * 6
    out = gb.replay(name, ops)()
    assert out.shape == (5, 3, 6) and torch.isfinite(out).all()
    assert ops[1][1] == b.stride()


def test_paired_best_shares_one_load():
    gb = benchmark_module("dlrm_gemm_bound")
    a = torch.randn(64, 64)
    fn = lambda: a @ a
    t, t_roof = gb.paired_best(fn, fn, windows=2, window_s=0.01)
    assert 0 < t < 1 and 0 < t_roof < 1
