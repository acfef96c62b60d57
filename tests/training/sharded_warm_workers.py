"""What test_sharded_warm_start.py runs on each rank (launched by sharding_workers.launch): a sharded deepfm trained
2 steps and saved, then continued one step (the reference); and warm starts of that checkpoint into a grown
vocabulary, sharded again, their optimizer states loaded and the same third step taken. Ranks write their results
(local optimizer-state shards with their offsets, the whole weights gathered) beside the checkpoint."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from conftest import contract_schema, make_batch, planted_data
from training.sharding_workers import LossOf, gather_full

from ctrkit.schema import Schema

OPTIMIZERS = ("rowwise_adagrad", "adagrad")
LR, GLOBAL = 0.1, 64
PARAMS = {"embedding_backend": "torchrec", "dnn_hidden": [16]}


def schema_of(dim: int, grown: bool = False) -> Schema:
    """The contract schema with tables of width ``dim``; ``grown``: every table 3 + i rows more (new ids)."""
    s = contract_schema()
    return replace(s, sparse=[replace(f, embedding_dim=dim, vocab_size=f.vocab_size + (3 + i if grown else 0))
                              for i, f in enumerate(s.sparse)])


def data() -> dict[str, np.ndarray]:
    return planted_data(3 * GLOBAL, seed=3, schema=schema_of(8))  # known ids only (< the old vocabulary)


def reset_ids() -> list[int]:
    """Two user ids that the first two steps touched and the third (the compared one) does not: their rows reset
    by expiry leave the third step on every other row as the reference takes it."""
    user = data()["user"]
    return sorted(set(user[: 2 * GLOBAL].tolist()) - set(user[2 * GLOBAL:].tolist()))[:2]


def train_step(sm: Any, opts: Any, step: int, rank: int, world: int, dim: int) -> None:
    """Step ``step``: this rank's share of global batch ``step`` (DDP averages the ranks' mean losses)."""
    per = GLOBAL // world
    start = step * GLOBAL + rank * per
    sm.module(make_batch(data(), slice(start, start + per), schema_of(dim))).backward()
    opts.step()
    opts.zero_grad()


def local_states(module: Any) -> dict[tuple[str, str], tuple[tuple[int, ...], list[tuple[list[int], torch.Tensor]]]]:
    """This rank's shards of the fused optimizer's states: (param, state) -> (global size, [(offsets, values)])."""
    out = {}
    for param, states in module.fused_optimizer.state_dict()["state"].items():
        for name, st in states.items():
            out[param, name] = (tuple(st.size()), [(list(s.metadata.shard_offsets), s.tensor.detach().clone())
                                                   for s in st.local_shards()])
    return out


def build(dim: int, seed: int, grown: bool, reset: dict[str, list[int]] | None = None, ckpt: Any = None) -> Any:
    from ctrkit.models.registry import create_model
    from ctrkit.training.warm_start import load_grown_weights

    torch.manual_seed(seed)
    model = create_model("deepfm", schema_of(dim, grown), **PARAMS)
    if ckpt is not None:
        load_grown_weights(model, ckpt, PARAMS, reset=reset)
    return LossOf(model)


def save_phase(rank: int, world: int, out: str, dim: int, sharding: str) -> None:
    """For each optimizer: 2 steps, saved to ``<out>/<opt>`` (with the dense and replicated tables' optimizer states,
    as the Trainer's writer saves them), the fused states' local shards to ``<opt>.saved-<rank>.pt``; then the third
    step, the whole weights after it to ``<opt>.continued.pt`` (rank 0)."""
    from ctrkit.checkpoint import Checkpoint
    from ctrkit.training.sharded_checkpoint import save_sharded
    from ctrkit.training.sharding import shard

    for opt in OPTIMIZERS:
        ck = Path(out) / opt
        sm = shard(build(dim, 0, False), sharding=sharding, sparse_optimizer=opt, embedding_lr=LR)
        opts = sm.optimizers("adam", 0.01)
        for step in range(2):
            train_step(sm, opts, step, rank, world, dim)
        meta = Checkpoint("deepfm", {}, model_params=PARAMS, schema=schema_of(dim), optimizer=opts.state_dict(),
                          config={"train": {"dense_optimizer": "adam", "sparse_optimizer": opt}})
        save_sharded(ck, sm.module, meta, plan=sm.plan)
        torch.save(local_states(sm.module), f"{ck}.saved-{rank}.pt")
        train_step(sm, opts, 2, rank, world, dim)
        after = gather_full(sm.module.state_dict())
        if rank == 0:
            torch.save(after, f"{ck}.continued.pt")


def warm_phase(rank: int, world: int, out: str, dim: int, sharding: str) -> None:
    """For each optimizer, two warm starts of ``<out>/<opt>`` into the grown vocabulary sharded with ``sharding``:
    "kept" (:func:`~ctrkit.training.sharded_warm.load_grown_sharded`, the user rows of :func:`reset_ids` reset) and
    "fresh" (the control: the dense and replicated states loaded, the fused ones not). Each: the fused states' local
    shards before the third step to ``<opt>.<arm>-<rank>.pt``, the weights after it and the parts loaded to
    ``<opt>.<arm>.pt`` (rank 0)."""
    from ctrkit.checkpoint import SHARDED_META, Checkpoint
    from ctrkit.training.sharded_warm import load_grown_sharded, replicated_layout
    from ctrkit.training.sharding import shard
    from ctrkit.training.warm_start import load_grown_optimizer

    for opt in OPTIMIZERS:
        ck = Path(out) / opt
        ckpt = Checkpoint.load(ck)  # read whole; its dense and replicated optimizer states are in its metadata
        ckpt.optimizer = Checkpoint.load(ck / SHARDED_META).optimizer
        same = {"dense": True, "sparse": True}
        for arm in ("kept", "fresh"):
            reset = {"user": reset_ids()} if arm == "kept" else None
            sm = shard(build(dim, 99, True, reset, ckpt), sharding=sharding, sparse_optimizer=opt, embedding_lr=LR)
            opts = sm.optimizers("adam", 0.01)
            if arm == "kept":
                parts = load_grown_sharded(sm.module, sm.replicated, opts, ckpt, ck, same, reset)
            else:
                parts = load_grown_optimizer(opts, ckpt, replicated_layout(sm.module, sm.replicated, ckpt.weights),
                                             same)
            torch.save(local_states(sm.module), f"{ck}.{arm}-{rank}.pt")
            replica = {i: s["sum"].clone() for i, s in opts.sparse.state_dict()["state"].items() if "sum" in s}
            train_step(sm, opts, 2, rank, world, dim)
            after = gather_full(sm.module.state_dict())
            if rank == 0:
                torch.save({"after": after, "parts": parts, "replicated": sm.replicated, "replica": replica},
                           f"{ck}.{arm}.pt")
        dist.barrier()
