"""Warm start of sharded tables (issue 28 item 2, torchrec backend on several processes): the optimizer states of a
sharded checkpoint (training/sharded_checkpoint.py) grown into a new run's sharded model, of any world size and plan.

A sharded run's table states live in two places, and both are kept:

- the fused optimizers (fbgemm's, inside the backward) of the sharded tables. The checkpoint's DCP files hold them
  under ``fused_optimizer`` (torchrec's ``fused_optimizer.state_dict()``: per table parameter, e.g.
  ``...embedding_bags.user#b8.weight``, states such as ``user#b8.momentum1``). Each rank reads those of the tables it
  holds shards of, whole (:func:`read_fused_states`), and writes them into its local shards of the new run's states
  (:func:`load_grown_fused`). torchrec lays a state out in one of three ways, told apart by its global shape:

  ========================  ==============================  ===========================================
  state                     global shape                    example
  ========================  ==============================  ===========================================
  pointwise                 ``(R, D)``, as the table        EXACT_ADAGRAD's ``momentum1`` (sum of g^2)
  row-wise                  ``(K * R,)``: one block of R    EXACT_ROWWISE_ADAGRAD's ``momentum1``
                            per column shard (K of them;    (sum of mean_d g^2)
                            K = 1 unless column-sharded)
  one value per shard       ``(shards,)``                   (none of ctrkit's three optimizers)
  ========================  ==============================  ===========================================

  Growing: rows ``0..R_old-1`` of each block take the checkpoint's values, the new rows and the rows expiry reset
  keep what the new run's fresh optimizer holds (its initial value). A row-wise state whose column shards differ in
  number (K) between the two plans, or a state of another layout, starts fresh with a warning naming the table.
- the replicated (``data_parallel``) tables, stepped by ctrkit's copy of the fused update, whose state is the
  Trainer's sparse optimizer's (its ``optimizer`` entry in the checkpoint): grown by
  :func:`~ctrkit.training.warm_start.load_grown_optimizer` with a layout of those tables (:func:`replicated_layout`).

The dense optimizer's state is the checkpoint's as in any warm start.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrkit.checkpoint import SHARDED_WEIGHTS, Checkpoint
from ctrkit.nn.embedding_torchrec import ctrkit_name
from ctrkit.training.warm_start import Layout, Resets, load_grown_optimizer

log = logging.getLogger(__name__)

__all__ = ["load_grown_fused", "load_grown_sharded", "read_fused_states", "replicated_layout", "table_key"]

# a torchrec table parameter of ctrkit's TorchrecEmbeddingCollection at <path>: its EmbeddingBagCollection's or a
# dim's EmbeddingCollection's weight (the sharded modules keep these names)
_TABLE = re.compile(r"^(?P<path>.*?)\.?(?:ebc\.embedding_bags|ecs\.d\d+\.embeddings)\.(?P<name>[^.]+)\.weight$")


def table_key(name: str) -> str | None:
    """The state-dict key (ctrkit's name, ``<collection path>.tables.<table>``) of a torchrec table parameter
    named ``name`` in the training module; None when ``name`` is not a table's."""
    m = _TABLE.match(name)
    if m is None:
        return None
    return f"{m['path']}.tables.{ctrkit_name(m['name'])}" if m["path"] else f"tables.{ctrkit_name(m['name'])}"


def read_fused_states(path: str | Path, params: Iterable[str] | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """The fused optimizers' states in the sharded checkpoint at ``path``, whole: table parameter -> {state name:
    tensor}, of the parameters ``params`` only (default all: a rank reads the tables it holds shards of); {} when the
    checkpoint holds none (an optimizer without state, as sgd)."""
    from torch.distributed.checkpoint import FileSystemReader, default_planner, state_dict_loader

    reader = FileSystemReader(str(Path(path) / SHARDED_WEIGHTS))
    if not any(k.startswith("fused_optimizer.") for k in reader.read_metadata().state_dict_metadata):
        return {}
    keys = {"fused_optimizer"} if params is None else {f"fused_optimizer.state.{p}" for p in params}
    state: dict[str, Any] = {}
    if keys:
        state_dict_loader._load_state_dict(state, storage_reader=reader, no_dist=True,
                                           planner=default_planner._EmptyStateDictLoadPlanner(keys=keys))
    return {k: dict(v) for k, v in state.get("fused_optimizer", {}).get("state", {}).items()}


def load_grown_fused(module: Any, saved: Mapping[str, Mapping[str, torch.Tensor]], old_rows: Mapping[str, int],
                     reset: Resets | None = None, what: str = "--warm-start", prefix: str = "model.") -> list[str]:
    """The fused optimizer of ``module`` (a DistributedModelParallel) <- ``saved`` (:func:`read_fused_states`), each
    state grown from the table's ``old_rows`` (model state-dict key -> rows in the checkpoint) to its rows now, the
    rows ``reset`` {table: ids} fresh (module docstring). Returns the states loaded ("<param>.<state>"); the others
    keep their fresh values, with a warning."""
    fused = module.fused_optimizer
    current = fused.state_dict()
    loaded, fresh = [], []
    with torch.no_grad():
        for param, states in current["state"].items():
            key = table_key(param)
            rows = int(fused.params[param].size(0))
            old_key = key.removeprefix(prefix) if key is not None else None
            resets = _reset_mask(reset or {}, key, rows)  # the table's, shared by its states
            for name, st in states.items():
                why = _grow_into(st, saved.get(param, {}).get(name), old_rows.get(old_key or "", -1), rows, resets)
                (fresh.append(f"{param} {name} ({why})") if why else loaded.append(f"{param}.{name}"))
    fused.load_state_dict(current)
    if fresh:
        log.warning("%s: these fused optimizer states of sharded tables start fresh: %s", what, fresh)
    log.info("%s: %d fused optimizer states of sharded tables grown from the checkpoint", what, len(loaded))
    return loaded


def _reset_mask(reset: Resets, key: str | None, rows: int) -> torch.Tensor:
    """(rows,) bool: the table's rows that start afresh (expiry)."""
    mask = torch.zeros(rows, dtype=torch.bool)
    ids = reset.get(key.rsplit(".", 1)[-1], ()) if key is not None else ()
    if len(ids):
        mask[torch.as_tensor(np.asarray(ids, np.int64))] = True
    return mask


def _local_shards(st: Any) -> list[tuple[list[int], torch.Tensor]] | None:
    """[(offsets, local tensor)] of a ShardedTensor or a plain tensor (one shard at 0); None for another type."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    if isinstance(st, ShardedTensor):
        return [(list(s.metadata.shard_offsets), s.tensor) for s in st.local_shards()]
    if isinstance(st, torch.Tensor):
        return [([0] * st.dim(), st)]
    return None


def _grow_into(st: Any, old: torch.Tensor | None, old_rows: int, rows: int, reset: torch.Tensor) -> str | None:
    """Write ``old`` (a state of a table of ``old_rows`` rows, whole) grown into the local shards of ``st`` (the same
    state now, the table of ``rows`` rows); None when done, else why it stays fresh."""
    shards = _local_shards(st)
    if old is None:
        return "the checkpoint holds none"
    if shards is None:
        return f"a state of type {type(st).__name__} is not handled"
    size = tuple(st.size())
    if old_rows <= 0 or old_rows > rows:
        return f"the table's rows in the checkpoint are unknown or more than now ({old_rows} -> {rows})"
    keep = torch.arange(rows) < old_rows
    keep &= ~reset
    if len(size) == 2 and tuple(old.shape) == (old_rows, size[1]) and size[0] == rows:  # pointwise
        for (r0, c0), t in shards:
            r = torch.arange(r0, r0 + t.shape[0])
            k = keep[r]
            t[k] = old[r[k], c0: c0 + t.shape[1]].to(t)
        return None
    if len(size) == 1 and old.dim() == 1 and size[0] % rows == 0 and old.numel() % old_rows == 0:  # row-wise
        blocks, old_blocks = size[0] // rows, old.numel() // old_rows
        if blocks != old_blocks:
            return f"row-wise state over {old_blocks} column shards in the checkpoint and {blocks} now"
        for (p0,), t in shards:
            pos = torch.arange(p0, p0 + t.shape[0])
            block, r = pos // rows, pos % rows
            k = keep[r]
            t[k] = old[block[k] * old_rows + r[k]].to(t)
        return None
    return f"a state of shape {tuple(old.shape)} in the checkpoint and {size} now"


def replicated_layout(module: Any, replicated: list[str], old_weights: Mapping[str, torch.Tensor],
                      reset: Resets | None = None, prefix: str = "model.") -> Layout:
    """The :data:`~ctrkit.training.warm_start.Layout` of the replicated tables of a sharded ``module`` (parameter
    names ``replicated``, each its own table): rows in the checkpoint (``old_weights``, the model's state dict), all
    at row 0, and the rows ``reset`` {table: ids}."""
    params = dict(module.named_parameters())
    out: Layout = {}
    for name in replicated:
        key = table_key(name)
        old_key = key.removeprefix(prefix) if key is not None else None
        if old_key not in old_weights or name not in params:
            continue
        n = int(old_weights[old_key].shape[0])
        ids = (reset or {}).get(old_key.rsplit(".", 1)[-1], ())
        out[id(params[name])] = (n, [(0, 0, n)], torch.as_tensor(np.asarray(ids, np.int64)))
    return out


def load_grown_sharded(module: Any, replicated: list[str], optimizer: Any, ckpt: Checkpoint, path: str | Path,
                       same: Mapping[str, bool], reset: Resets | None = None, what: str = "--warm-start") -> list[str]:
    """A sharded training ``module`` (its replicated table parameters named ``replicated``) and the Trainer's
    ``optimizer`` set <- the optimizer states of the sharded checkpoint at ``path`` (``ckpt``: it read whole, its
    ``optimizer`` the dense and replicated tables' states), grown (module docstring); ``same``: as for
    :func:`~ctrkit.training.warm_start.load_grown_optimizer`, "sparse" also saying whether the fused states fit this
    run (the same sparse optimizer, sharded tables). Returns the parts loaded ("dense", "sparse", "fused")."""
    layout = replicated_layout(module, replicated, ckpt.weights, reset)
    parts = load_grown_optimizer(optimizer, ckpt, layout, same, what)
    if not same.get("sparse", False):
        log.warning("%s: the sharded tables' fused optimizer states start fresh: the checkpoint was trained with "
                    "another sparse optimizer or embedding backend (%s)", what, ckpt.source)
        return parts
    rows = {k: int(v.shape[0]) for k, v in ckpt.weights.items() if ".tables." in f".{k}" and v.dim() == 2}
    mine = list(module.fused_optimizer.state_dict()["state"])  # the tables this rank holds shards of
    if load_grown_fused(module, read_fused_states(path, mine), rows, reset, what):
        parts.append("fused")
    return parts
