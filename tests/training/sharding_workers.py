"""What the sharding tests run on each rank: a launcher (spawned processes on gloo over 127.0.0.1, a free port, a
deadline) and the rank functions. Each rank writes its results under ``out``; the tests compare them there with
references computed in one process."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from ctrkit.models.base import logits_of
from ctrkit.training.distributed import end_worker_process


class LossOf(nn.Module):
    """The mean logistic loss of a model on a batch (what DistributedModelParallel wraps)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Any) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(logits_of(self.model(batch)), batch.labels)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn: Any, world: int, port: int, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()
    end_worker_process(0)  # torchrec keeps the group's threads alive: no interpreter finalization after them


def launch(fn: Any, world: int, *args: Any, timeout_s: float = 120.0) -> None:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned processes; an error (or the deadline) fails the caller."""
    ctx = mp.start_processes(_entry, args=(fn, world, free_port(), args), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"{fn.__name__} on {world} ranks did not finish in {timeout_s:.0f} s")


def gather_full(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Rank 0: every tensor of a sharded state dict whole (ShardedTensors gathered); other ranks: {}."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    out = {}
    for k, v in state.items():
        if isinstance(v, ShardedTensor):
            full = torch.zeros(v.size()) if dist.get_rank() == 0 else None
            v.gather(0, full)
            out[k] = full
        else:
            out[k] = v.detach().clone()
    return out if dist.get_rank() == 0 else {}


def build_deepfm(seed: int = 0) -> nn.Module:
    from conftest import contract_schema

    from ctrkit.models.registry import create_model

    torch.manual_seed(seed)
    return create_model("deepfm", contract_schema(), embedding_backend="torchrec", dnn_hidden=(16,))


# ---- the steps of sharded training against one process ------------------------------------------------------
STEPS, GLOBAL_BATCH = 3, 64


def sharded_steps(rank: int, world: int, out: str, cases: list[tuple[str, str]]) -> None:
    """For each (sharding, sparse optimizer): deepfm (torchrec tables) sharded, STEPS steps on this rank's share of
    each global batch; rank 0 saves the whole weights before and after and the plan."""
    from conftest import contract_schema, make_batch, planted_data

    from ctrkit.training.sharding import shard

    schema, data = contract_schema(), planted_data(STEPS * GLOBAL_BATCH, seed=5)
    per = GLOBAL_BATCH // world
    for sharding, opt in cases:
        sm = shard(LossOf(build_deepfm()), sharding=sharding, sparse_optimizer=opt, embedding_lr=0.05)
        before = gather_full(sm.module.state_dict())
        optimizers = sm.optimizers("adam", 0.01)
        for step in range(STEPS):
            start = step * GLOBAL_BATCH + rank * per
            loss = sm.module(make_batch(data, slice(start, start + per), schema))
            loss.backward()
            optimizers.step()
            optimizers.zero_grad()
        after = gather_full(sm.module.state_dict())
        if rank == 0:
            torch.save({"before": before, "after": after, "plan": sm.sharding_types()},
                       Path(out) / f"{sharding}-{opt}.pt")


# ---- sharded checkpoints: save at one world size, load at another -------------------------------------------
def score_batch() -> Any:
    from conftest import contract_schema, make_batch, planted_data

    return make_batch(planted_data(40, seed=9), slice(0, 40), contract_schema())


def checkpoint_phase(rank: int, world: int, ck: str, phase: str, sharding: str) -> None:
    """``save``: deepfm sharded with ``sharding``, 2 steps, written to ``ck`` with save_sharded; ``load``: a deepfm of
    other initial weights sharded with ``sharding``, ``ck`` loaded into it. Both: rank 0 saves the scores of
    :func:`score_batch` (every rank scores the whole batch) to ``<ck>.<phase>-<world>.pt``."""
    from conftest import contract_schema, make_batch, planted_data

    from ctrkit.checkpoint import Checkpoint
    from ctrkit.training.sharded_checkpoint import load_sharded, save_sharded
    from ctrkit.training.sharding import shard

    sm = shard(LossOf(build_deepfm(seed=0 if phase == "save" else 99)), sharding=sharding,
                     sparse_optimizer="rowwise_adagrad", embedding_lr=0.1)
    if phase == "save":
        data, per = planted_data(128, seed=3), 64 // world
        optimizers = sm.optimizers("adam", 0.01)
        for step in range(2):
            start = step * 64 + rank * per
            sm.module(make_batch(data, slice(start, start + per), contract_schema())).backward()
            optimizers.step()
            optimizers.zero_grad()
        meta = Checkpoint("deepfm", {}, model_params={"embedding_backend": "torchrec", "dnn_hidden": [16]},
                          schema=contract_schema())
        save_sharded(ck, sm.module, meta, plan=sm.plan)
    else:
        load_sharded(ck, sm.module)
    with torch.no_grad():
        scores = logits_of(sm.module.module.model.eval()(score_batch()))
    if rank == 0:
        torch.save(scores, f"{ck}.{phase}-{world}.pt")


def warm_phase(rank: int, world: int, ck: str, sharding: str) -> None:
    """Warm start from the sharded checkpoint ``ck`` (read whole, as the single-process readers do): deepfm of other
    initial weights built for a grown vocabulary (every table 3 + i rows more), its tables grown from ``ck``, then
    sharded with ``sharding``; rank 0 saves the scores of :func:`score_batch` to ``<ck>.warm-<world>.pt``."""
    from dataclasses import replace

    from conftest import contract_schema

    from ctrkit.checkpoint import Checkpoint
    from ctrkit.models.registry import create_model
    from ctrkit.training.sharding import shard
    from ctrkit.training.warm_start import load_grown_weights

    s = contract_schema()
    grown = replace(s, sparse=[replace(f, vocab_size=f.vocab_size + 3 + i) for i, f in enumerate(s.sparse)])
    torch.manual_seed(99)
    model = create_model("deepfm", grown, embedding_backend="torchrec", dnn_hidden=(16,))  # tables allocated
    sizes = load_grown_weights(model, Checkpoint.load(ck), {"embedding_backend": "torchrec", "dnn_hidden": [16]})
    assert any(a < b for a, b in sizes.values()), sizes
    sm = shard(LossOf(model), sharding=sharding, sparse_optimizer="rowwise_adagrad", embedding_lr=0.1)
    with torch.no_grad():
        scores = logits_of(sm.module.module.model.eval()(score_batch()))
    if rank == 0:
        torch.save(scores, f"{ck}.warm-{world}.pt")


BATCH = 256  # per rank: a global batch of 512


# ---- Criteo: sharded training and exact evaluation ----------------------------------------------------------
def criteo_auc(rank: int, world: int, out: str, store: str, test_store: str, sharding: str, batch: int) -> None:
    """deepfm (torchrec tables, initial weights from ``out``/init.pt) trained one epoch on the Criteo sample, batch i
    of the shuffled epoch to rank i mod world; the test split scored by every rank (a disjoint share each) and
    gathered; rank 0 saves the scores, the labels, the plan and the tables before / after."""
    from ctrkit.data.storage.loader import BatchLoader
    from ctrkit.training.sharding import shard

    model = criteo_model(store, backend="torchrec")
    model.load_state_dict(torch.load(Path(out) / "init.pt", weights_only=True))
    sm = shard(LossOf(model), sharding=sharding, sparse_optimizer="adagrad", embedding_lr=0.05)
    before = gather_full(sm.module.state_dict())
    optimizers = sm.optimizers("adam", 1e-3)
    train = list(BatchLoader(store, batch, shuffle=True, seed=0, drop_last=True))
    for b in train[rank: len(train) - len(train) % world: world]:  # every rank the same number of steps
        sm.module(b).backward()
        optimizers.step()
        optimizers.zero_grad()
    scores, labels = [], []
    test = list(BatchLoader(test_store, batch, shuffle=False))
    with torch.no_grad():  # every rank the same number of forwards (they exchange embeddings): the last pads
        for i in range(rank, -(-len(test) // world) * world, world):
            s = logits_of(sm.module.module.model(test[min(i, len(test) - 1)]))
            if i < len(test):
                scores.append(s)
                labels.append(test[i].labels)
    mine = (torch.cat(scores).numpy(), torch.cat(labels).numpy())
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, mine)
    after = gather_full(sm.module.state_dict())
    if rank == 0:
        torch.save({"scores": np.concatenate([p[0] for p in parts]), "labels": np.concatenate([p[1] for p in parts]),
                    "before": before, "after": after, "plan": sm.sharding_types()},
                   Path(out) / f"{sharding}.pt")


def criteo_model(store: str, backend: str) -> nn.Module:
    from ctrkit.data.storage.store import Store
    from ctrkit.models.registry import create_model

    torch.manual_seed(0)
    return create_model("deepfm", Store(store).schema, embedding_backend=backend, dnn_hidden=(64, 32))


def fused_equivalent(store: str, out: str, batch: int, world: int) -> nn.Module:
    """The reference in one process: the fused deepfm from the same initial weights, each step on the same global
    batch (``world`` loader batches, their mean losses averaged, as DDP averages), scored on the test split."""
    from ctrkit.data.storage.loader import BatchLoader
    from ctrkit.training.optim import (
        OptimizerSet,
        build_dense_optimizer,
        build_sparse_optimizer,
        split_parameters,
    )

    model = criteo_model(store, backend="fused")
    model.load_state_dict(torch.load(Path(out) / "init.pt", weights_only=True))
    loss_of = LossOf(model)
    dense, emb = split_parameters(model)
    opt = OptimizerSet(build_dense_optimizer("adam", dense, 1e-3), build_sparse_optimizer("adagrad", emb, 0.05))
    batches = list(BatchLoader(store, batch, shuffle=True, seed=0, drop_last=True))
    for i in range(0, len(batches) - world + 1, world):
        sum(loss_of(b) for b in batches[i: i + world]).div(world).backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


# ---- the Trainer with sharded tables ------------------------------------------------------------------------
def trainer_run(rank: int, world: int, out: str, train: str, valid: str, epochs: int, resume: bool) -> None:
    """The Trainer on ``world`` ranks: deepfm with torchrec tables (table_wise), evaluation on the valid split each
    epoch (3 batches: the ranks' shares differ), sharded best.pt / last.pt in ``out``/run; with ``resume``, from
    last.pt. Rank 0 saves the fit summary to ``out``/summary-<epochs>.pt."""
    from ctrkit.data.storage.loader import BatchLoader
    from ctrkit.data.storage.store import Store
    from ctrkit.training.config import TrainConfig
    from ctrkit.training.distributed import DistContext
    from ctrkit.training.trainer import Trainer
    from ctrkit.training.writer import CheckpointWriter

    ctx = DistContext(rank, world, rank, "gloo", torch.device("cpu"))
    cfg = TrainConfig(epochs=epochs, lr=1e-3, embedding_lr=0.05, progress=False)
    cfg.distributed.sharding = "table_wise"
    rows = len(Store(valid)["label"])
    writer = CheckpointWriter(Path(out) / "run", model_name="deepfm", schema=Store(train).schema,
                              model_params={"embedding_backend": "torchrec", "dnn_hidden": [64, 32]})
    trainer = Trainer(criteo_model(train, "torchrec"), BatchLoader(train, 256, seed=0, rank=rank, world_size=world),
                      cfg, valid_loader=BatchLoader(valid, -(-rows // 3), shuffle=False, rank=rank, world_size=world,
                                                    even_tail=False),
                      run_dir=Path(out) / "run", dist=ctx, overwrite=True, writer=writer,
                      resume_from=Path(out) / "run" / "last.pt" if resume else None)
    summary = trainer.fit()
    if rank == 0:
        torch.save(summary, Path(out) / f"summary-{epochs}.pt")


# ---- tables built on the meta device: each rank allocates its shards only ----------------------------------
def big_schema(rows: int, dim: int = 16) -> Any:
    """4 single-valued fields (the contract schema's names, for ``planted_data``) of ``rows`` ids each (tables
    ``rows`` x ``dim``) and one dense value."""
    from ctrkit.schema import DenseFeature, Schema, SparseFeature

    return Schema(dense=[DenseFeature("d0")],
                  sparse=[SparseFeature(name, rows, dim) for name in ("user", "item", "cat", "ctx")])


def build_big(rows: int, seed: int = 0) -> nn.Module:
    from ctrkit.models.registry import create_model

    torch.manual_seed(seed)
    return create_model("dlrm", big_schema(rows), embedding_backend="torchrec", dense_arch=(16,), over_arch=(16,))


def resident_bytes() -> int:
    """This process's resident set size (VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def meta_step(rank: int, world: int, out: str, rows: int, sharding: str) -> None:
    """dlrm with 4 tables of ``rows`` x 16 built within meta_tables, sharded with ``sharding``, one training step;
    each rank saves its resident memory before building / after the step, the bytes of its local table shards, and
    a sha256 of every local shard with its offsets (to compare with the rows of a one-process build)."""
    import hashlib

    from conftest import make_batch, planted_data
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    from ctrkit.nn.embedding_torchrec import meta_tables
    from ctrkit.training.sharding import shard

    def step(sm: Any, rows: int) -> torch.Tensor:
        schema = big_schema(rows)
        optimizers = sm.optimizers("adam", 0.01)
        loss = sm.module(make_batch(planted_data(64, seed=rank, schema=schema), slice(0, 64), schema))
        loss.backward()
        optimizers.step()
        return loss

    with meta_tables():  # warm-up on tables of 1,000 rows: code loaded, caches made, before the baseline
        step(shard(LossOf(build_big(1000)), sharding=sharding, sparse_optimizer="rowwise_adagrad"), 1000)
    dist.barrier()
    before = resident_bytes()
    t0 = time.perf_counter()
    with meta_tables():
        model = build_big(rows)
    built = resident_bytes()
    sm = shard(LossOf(model), sharding=sharding, sparse_optimizer="rowwise_adagrad", embedding_lr=0.05)
    start_s = time.perf_counter() - t0
    sharded = resident_bytes()
    hashes, local = {}, 0
    for key, value in sm.module.state_dict().items():
        if isinstance(value, ShardedTensor):
            for s in value.local_shards():
                local += s.tensor.numel() * s.tensor.element_size()
                raw = memoryview(s.tensor.detach().numpy())  # no copy: the shard's own memory (contiguous)
                hashes[(key, *s.metadata.shard_offsets, *s.metadata.shard_sizes)] = hashlib.sha256(raw).hexdigest()
    dense = {k: v.detach().clone() for k, v in sm.module.state_dict().items() if not isinstance(v, ShardedTensor)}
    hashed = resident_bytes()
    loss = step(sm, rows)
    after = resident_bytes()
    torch.save({"before": before, "after": after, "local": local, "hashes": hashes, "dense": dense,
                "loss": float(loss), "start_s": start_s,
                "stages": [built - before, sharded - before, hashed - before, after - before], "plan": sm.sharding_types()}, Path(out) / f"rank{rank}.pt")
