"""Sharded tables (training/sharding.py) on 2 ranks (gloo, spawned processes): the same steps as one process with the
fused backend on the same global batches, for each sharding type the CPU offers; every table updated, the
data_parallel ones included; the plan limited to what the device supports; clear errors for what it does not."""

from __future__ import annotations

import pytest
import torch
from conftest import contract_schema, make_batch, planted_data

from ctrkit.models.registry import create_model
from ctrkit.nn.embedding_torchrec import torchrec_available
from ctrkit.training.optim import (
    OptimizerSet,
    build_dense_optimizer,
    build_sparse_optimizer,
    split_parameters,
)

pytestmark = pytest.mark.skipif(not torchrec_available(), reason="torchrec is not installed (ctrkit[distributed], "
                                "see the Makefile's install step)")

CASES = [("table_wise", "adagrad"), ("column_wise", "rowwise_adagrad"), ("data_parallel", "sgd"),
         ("auto", "adagrad")]


def one_process(init: dict[str, torch.Tensor], opt: str) -> dict[str, torch.Tensor]:
    """The reference: fused deepfm from ``init``, the same STEPS global batches in one process."""
    from training.sharding_workers import GLOBAL_BATCH, STEPS, LossOf

    schema, data = contract_schema(), planted_data(STEPS * GLOBAL_BATCH, seed=5)
    model = create_model("deepfm", schema, dnn_hidden=(16,))
    model.load_state_dict({k.removeprefix("model."): v for k, v in init.items()})
    dense, emb = split_parameters(model)
    opts = OptimizerSet(build_dense_optimizer("adam", dense, 0.01), build_sparse_optimizer(opt, emb, 0.05))
    loss_of = LossOf(model)
    for step in range(STEPS):
        loss_of(make_batch(data, slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH), schema)).backward()
        opts.step()
        opts.zero_grad()
    return {f"model.{k}": v for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_two_ranks_take_the_same_steps_as_one_process(tmp_path):
    from training.sharding_workers import launch, sharded_steps

    launch(sharded_steps, 2, str(tmp_path), CASES, timeout_s=150)
    for sharding, opt in CASES:
        got = torch.load(tmp_path / f"{sharding}-{opt}.pt", weights_only=False)
        plan = got["plan"]
        narrow = {k: v for k, v in plan.items() if k.startswith("model.linear.")}  # first-order weights, dim 1
        wide = {k: v for k, v in plan.items() if k not in narrow}
        assert len(wide) == 5 and len(narrow) == 5, plan  # dim 8 tables; first-order weights (dim 1)
        assert set(narrow.values()) == {"data_parallel"}, plan  # fbgemm's kernels: widths in multiples of 4
        if sharding != "auto":
            assert set(wide.values()) == {sharding}, plan
        want = one_process(got["before"], opt)
        tables = [k for k in want if ".tables." in k]
        assert len(tables) == 10  # 5 tables of dim 8, 5 first-order tables of dim 1
        for k in tables:  # every table updated, whatever the planner chose
            assert not torch.equal(got["after"][k], got["before"][k]), f"{sharding}/{opt}: {k} was not updated"
        for k, v in want.items():
            where = f"{sharding}/{opt} {k} ({plan})"
            torch.testing.assert_close(got["after"][k], v, rtol=1e-4, atol=1e-5, msg=lambda m, w=where: f"{w}: {m}")
