"""Sharded tables (training/sharding.py) on 2 ranks (gloo, spawned processes): the same steps as one process with the
fused backend on the same global batches, for each sharding type the CPU offers; every table updated, the
data_parallel ones included; the plan limited to what the device supports; clear errors for what it does not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import contract_schema, make_batch, planted_data

from ctrkit.models.registry import create_model
from ctrkit.nn.embedding_interface import EmbeddingCollection
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


# ---- issue 26 test (d): the Criteo sample, 2 ranks, table_wise and column_wise ---------------------------------
@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    from ctrkit.data.sources.criteo import preprocess_criteo
    from ctrkit.jobs.demo import SAMPLE

    d = tmp_path_factory.mktemp("criteo")
    return d, preprocess_criteo(SAMPLE, d / "store", split="0.8,0.1,0.1", seed=0, min_freq=8, embedding_dim=8,
                                progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["table_wise", "column_wise"])
def test_criteo_auc_of_two_sharded_ranks_matches_the_fused_backend(criteo, sharding):
    from training.sharding_workers import BATCH, criteo_auc, criteo_model, fused_equivalent, launch

    from ctrkit.data.storage.loader import BatchLoader
    from ctrkit.metrics import roc_auc
    from ctrkit.models.base import logits_of

    d, stores = criteo
    out = d / sharding
    out.mkdir()
    torch.save(criteo_model(str(stores["train"]), backend="torchrec").state_dict(), out / "init.pt")
    launch(criteo_auc, 2, str(out), str(stores["train"]), str(stores["test"]), sharding, BATCH, timeout_s=150)
    got = torch.load(out / f"{sharding}.pt", weights_only=False)
    wide = {k: v for k, v in got["plan"].items() if k.startswith("model.embedding.")}
    assert wide and set(wide.values()) == {sharding}, got["plan"]
    tables = [k for k in got["before"] if ".tables." in k]
    assert len(tables) == 2 * 26  # 26 fields: embeddings and first-order weights
    unchanged = [k for k in tables if torch.equal(got["after"][k], got["before"][k])]
    assert not unchanged, f"tables not updated under {sharding}: {unchanged}"
    ref = fused_equivalent(str(stores["train"]), str(out), BATCH, 2)

    with torch.no_grad():
        test = list(BatchLoader(stores["test"], BATCH, shuffle=False))
        want = torch.cat([logits_of(ref(b)) for b in test]).numpy()
        labels = torch.cat([b.labels for b in test]).numpy()
    order = np.concatenate([np.arange(i * BATCH, min((i + 1) * BATCH, len(labels)))
                            for r in range(2) for i in range(r, len(test), 2)])  # rank 0's batches, then rank 1's
    np.testing.assert_array_equal(got["labels"], labels[order])
    auc_sharded, auc_fused = roc_auc(got["scores"], got["labels"]), roc_auc(want, labels)
    assert auc_fused > 0.68  # it learned something (one epoch on 6.5k rows)
    print(f"criteo sample, {sharding} on 2 ranks: AUC {auc_sharded:.5f}; fused, one process: {auc_fused:.5f}")
    assert abs(auc_sharded - auc_fused) < 0.002, (auc_sharded, auc_fused)


# ---- sharded checkpoints (issue 26 item 4) -------------------------------------------------------------------
@pytest.mark.slow
def test_a_sharded_checkpoint_loads_at_another_world_size_and_as_the_fused_backend(tmp_path):
    from training.sharding_workers import checkpoint_phase, launch, score_batch

    from ctrkit.checkpoint import Checkpoint
    from ctrkit.errors import CheckpointError
    from ctrkit.models.base import logits_of

    for saved_at, loads in ((2, [(1, "table_wise"), (3, "column_wise")]), (1, [(2, "table_wise")])):
        ck = tmp_path / f"ck{saved_at}"
        launch(checkpoint_phase, saved_at, str(ck), "save", "table_wise", timeout_s=90)
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(f".ck{saved_at}")) == []  # no temp
        saved = torch.load(f"{ck}.save-{saved_at}.pt")
        files = Checkpoint.load(ck).extra["sharded"]["files"]
        assert len([f for f in files if f.endswith(".distcp")]) == saved_at  # every rank wrote its shards
        for world, sharding in loads:
            launch(checkpoint_phase, world, str(ck), "load", sharding, timeout_s=90)
            torch.testing.assert_close(torch.load(f"{ck}.load-{world}.pt"), saved, rtol=1e-6, atol=1e-6)
        fused = Checkpoint.load(ck).build_model()  # the single-process readers: fused backend, whole tables
        kinds = {type(m).__name__ for m in fused.modules() if isinstance(m, EmbeddingCollection)}
        assert kinds == {"EmbeddingBagCollection"}, kinds
        with torch.no_grad():
            torch.testing.assert_close(logits_of(fused(score_batch())), saved, rtol=1e-6, atol=1e-6)
    shard = next((tmp_path / "ck2" / "weights").glob("__1_*.distcp"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"__1_0\.distcp fails its checksum"):
        Checkpoint.load(tmp_path / "ck2")


@pytest.mark.slow
def test_a_sharded_checkpoint_warm_starts_sharded_tables_of_a_grown_vocabulary(tmp_path):
    """Issue 28 item 2 on sharded tables: a checkpoint written by 2 ranks grows into a model of a grown vocabulary
    that is then sharded column-wise on 2 ranks; rows of known ids score as the checkpoint's model."""
    from training.sharding_workers import checkpoint_phase, launch, warm_phase

    ck = tmp_path / "ck"
    launch(checkpoint_phase, 2, str(ck), "save", "table_wise", timeout_s=90)
    launch(warm_phase, 2, str(ck), "column_wise", timeout_s=90)
    torch.testing.assert_close(torch.load(f"{ck}.warm-2.pt"), torch.load(f"{ck}.save-2.pt"), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_the_trainer_trains_evaluates_checkpoints_and_resumes_sharded_tables(criteo, tmp_path):
    from training.sharding_workers import launch, trainer_run

    from ctrkit.checkpoint import Checkpoint
    from ctrkit.data.storage.loader import BatchLoader
    from ctrkit.metrics import roc_auc
    from ctrkit.models.base import logits_of

    _, stores = criteo
    launch(trainer_run, 2, str(tmp_path), str(stores["train"]), str(stores["valid"]), 1, False, timeout_s=120)
    first = torch.load(tmp_path / "summary-1.pt", weights_only=False)
    best = tmp_path / "run" / "best.pt"
    assert (best / "weights").is_dir() and (tmp_path / "run" / "last.pt" / "weights").is_dir()
    model = Checkpoint.load(best).build_model()  # the fused backend, one process
    with torch.no_grad():
        valid = list(BatchLoader(stores["valid"], 1000, shuffle=False))
        auc = roc_auc(torch.cat([logits_of(model(b)) for b in valid]).numpy(), torch.cat([b.labels for b in valid]))
    assert first["best_eval"]["auc"] == pytest.approx(auc, abs=1e-6)  # the gathered evaluation is exact
    launch(trainer_run, 2, str(tmp_path), str(stores["train"]), str(stores["valid"]), 2, True, timeout_s=120)
    second = torch.load(tmp_path / "summary-2.pt", weights_only=False)
    assert second["steps"] == 2 * first["steps"] and second["epochs_completed"] == 2


# ---- tables built on the meta device (issue 26 follow-up): a rank allocates its shards only ------------------
@pytest.mark.slow
def test_meta_built_tables_allocate_only_the_ranks_shards_and_equal_a_one_process_build(tmp_path):
    import hashlib

    from training.sharding_workers import build_big, launch, meta_step

    rows, fields, dim = 2_000_000, 4, 16
    full = rows * fields * dim * 4  # bytes of all tables
    launch(meta_step, 2, str(tmp_path), rows, "table_wise", timeout_s=150)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert set(ranks[0]["plan"].values()) == {"table_wise"}, ranks[0]["plan"]
    assert sum(r["local"] for r in ranks) == full and all(r["local"] == full // 2 for r in ranks), \
        [r["local"] for r in ranks]  # 2 of the 4 tables on each rank
    one = build_big(rows)  # the one-process build of the same seed: whole tables
    want = one.state_dict()
    for r, got in enumerate(ranks):
        grown = got["after"] - got["before"]
        print(f"rank {r}: resident +{grown / 2**20:.0f} MiB for tables of {full / 2**20:.0f} MiB "
              f"({grown / full:.2f}); shards {got['local'] / 2**20:.0f} MiB; built and sharded in "
              f"{got['start_s']:.2f} s; loss {got['loss']:.4f}; stages {[x >> 20 for x in got['stages']]}")
        assert np.isfinite(got["loss"])
        # its shards are resident, and little else (measured: shards + 30 to 80 MiB of optimizer state and allocator
        # slack); building the whole tables first, the former path, grew by shards + 1.15 x full (819 MiB)
        assert got["local"] * 0.9 < grown < got["local"] + 0.35 * full, (grown, got["local"], full)
        for (key, r0, c0, n, c), digest in got["hashes"].items():
            part = want[key.removeprefix("model.")][r0: r0 + n, c0: c0 + c].contiguous()
            assert hashlib.sha256(part.numpy().tobytes()).hexdigest() == digest, f"rank {r}: {key} rows {r0}+"
        for key, value in got["dense"].items():  # the dense part: as the one-process build draws it
            torch.testing.assert_close(value, want[key.removeprefix("model.")], rtol=0, atol=0, msg=key)
