"""The same code on CUDA (skipped without a GPU): models give the CPU's outputs with the same weights, and a
ranking and a retrieval run train and evaluate through the Trainer with ``train.device=cuda``."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import ListLoader, behaviour_schema, contract_schema, make_batch, planted_data

from ctrkit.models.base import logits_of
from ctrkit.models.registry import create_model
from ctrkit.retrieval.catalogue import ItemCatalogue
from ctrkit.training.config import TrainConfig
from ctrkit.training.tasks import CTRTask, RetrievalTask
from ctrkit.training.trainer import Trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("name, schema_of, params", [
    ("dlrm", contract_schema, {}), ("deepfm", contract_schema, {}), ("din", behaviour_schema, {}),
    # the zoo models that train through hand-written autograd nodes (nn/field_attention, afm_pool, bilinear_pairs)
    ("autoint", contract_schema, {}), ("afm", contract_schema, {}), ("fibinet", contract_schema, {}),
    ("wide_deep", contract_schema, {}), ("nfm", contract_schema, {}), ("xdeepfm", contract_schema, {}),
    ("dien", behaviour_schema, {}), ("two_tower", behaviour_schema, {}),
    ("sasrec", behaviour_schema, {"att_dropout": 0.0}),  # dropout masks differ between the devices' generators
])
def test_forward_and_backward_match_cpu(name, schema_of, params):
    schema = schema_of()
    data = planted_data(128, seed=2, schema=schema)
    torch.manual_seed(0)
    cpu = create_model(name, schema, **params).eval()
    gpu = copy.deepcopy(cpu).cuda()
    batch = make_batch(data, slice(0, 64), schema)
    with torch.no_grad():
        torch.testing.assert_close(logits_of(gpu(batch.to("cuda"))).cpu(), logits_of(cpu(batch)),
                                   rtol=1e-4, atol=1e-4)
    for m, b in ((cpu, batch), (gpu, batch.to("cuda"))):
        m.train()
        loss, _ = CTRTask().bind(m).loss(m, b)
        loss.backward()
    for (n, p), q in zip(cpu.named_parameters(), gpu.parameters()):
        if p.grad is None:
            continue
        g, h = (p.grad.to_dense() if p.grad.is_sparse else p.grad), q.grad
        h = h.to_dense() if h.is_sparse else h
        torch.testing.assert_close(h.cpu(), g, rtol=1e-3, atol=1e-4, msg=f"{name}: gradient of {n}")


def test_trainer_on_cuda_ranking_and_retrieval(tmp_path):
    schema = behaviour_schema()
    data = planted_data(512, seed=5, schema=schema)
    batches = ListLoader(make_batch(data, slice(s, s + 128), schema) for s in range(0, 384, 128))
    valid = [make_batch(data, slice(384, 512), schema)]
    cfg = TrainConfig(epochs=2, device="cuda", progress=False, sparse_optimizer="sparse_adam")
    torch.manual_seed(0)
    t = Trainer(create_model("din", schema).cuda(), batches, cfg, valid_loader=valid, run_dir=tmp_path / "din")
    s = t.fit()
    assert np.isfinite(s["last_eval"]["auc"])
    cat = ItemCatalogue({"item": np.arange(2, 40), "cat": np.arange(2, 40) % 10 + 2}, np.ones(38, np.int64))
    cfg = TrainConfig(epochs=2, device="cuda", progress=False, sparse_optimizer="sparse_adam",
                      metrics=["hr@10", "mrr"])
    for loss in ("in_batch", "sampled", "full"):
        torch.manual_seed(0)
        task = RetrievalTask(cat, loss=loss, num_negatives=8, metrics=["hr@10", "mrr"])
        t = Trainer(create_model("sasrec", schema).cuda(), batches, cfg, valid_loader=valid, run_dir=tmp_path / loss,
                    task=task)
        s = t.fit()
        on_gpu = s["last_eval"]
        model = t.model.cpu()
        cpu_task = RetrievalTask(cat, metrics=["hr@10", "mrr"]).bind(model)
        on_cpu = cpu_task.evaluate(model, valid)
        assert on_gpu["mrr"] == pytest.approx(on_cpu["mrr"], abs=1e-4), loss
