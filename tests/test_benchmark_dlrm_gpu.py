"""benchmarks/dlrm_gpu.py, known to work without a GPU: its --smoke run, and its GPU step's updates equal
ctrkit's own training step with sparse gradients and plain SGD (same model, same batch)."""

from __future__ import annotations

import copy
import json

import torch
from conftest import benchmark_module

from ctrkit.batch import Batch, KeyedJagged


def test_smoke_run_trains_and_reports(capsys):
    gpu = benchmark_module("dlrm_gpu")
    assert gpu.main(["--smoke", "--device", "cpu"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("RESULT "))
    r = json.loads(line.removeprefix("RESULT "))
    assert r["samples_per_s"] > 0 and r["flops_per_sample"] > 1e6
    assert all(map(torch.isfinite, torch.tensor([r["first_loss"], r["last_loss"]])))
    assert gpu.bf16_peak("NVIDIA H100 80GB HBM3") == 989.4 and gpu.bf16_peak("NVIDIA H100 PCIe") == 756.0


def test_gpu_step_equals_sparse_sgd_step():
    gpu = benchmark_module("dlrm_gpu")
    torch.manual_seed(0)
    model, cards = gpu.build(max_rows=50, dim=8, device=torch.device("cpu"))
    ref = copy.deepcopy(model)
    sa = model.sparse_arch
    offsets = torch.tensor([sa.row_offset[sa.feature_to_table[k]] for k in model.sparse_keys])
    dense, ids, labels = gpu.make_pool(1, 32, cards, offsets, torch.device("cpu"))[0]
    step = gpu.Step(model, "fp32", 0.5, 32, 8, torch.device("cpu"))
    step.dense.copy_(dense), step.ids.copy_(ids), step.labels.copy_(labels)
    loss = step()
    # reference: the model's own forward (sparse COO gradients for the table), torch SGD on every parameter
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    batch = Batch(dense=dense, sparse=KeyedJagged.from_dense(list(ref.sparse_keys), ids - offsets), labels=labels)
    want = torch.nn.functional.binary_cross_entropy_with_logits(ref(batch).logits, labels)
    want.backward()
    opt.step()
    torch.testing.assert_close(loss, want.detach())
    for (name, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
