"""Sharded checkpoints (issue 26 item 4): a sharded model's weights written with ``torch.distributed.checkpoint``
(DCP), every rank writing its own shards in parallel, loadable at another world size and, converted on load, by
the single-process readers.

On disk, a directory (``<run_dir>/last.pt`` is then a directory)::

    checkpoint.pt     a ctrkit Checkpoint (checkpoint.py) without weights: model name and parameters, schema,
                      config, pipeline, trainer state, the dense optimizer's state; extra["sharded"] holds
                      {"world_size", "sharding", "files": {file: sha256}} of the DCP files
    weights/          the DCP checkpoint: .metadata and one __<rank>_0.distcp per rank; keys "model.<name>" (the
                      model's state dict under ctrkit's names, tables as ShardedTensors) and "fused_optimizer.<...>"

Atomic: the ranks write into a temporary directory beside the target (its name chosen by rank 0 and broadcast), every
rank hashes the files it wrote, rank 0 writes ``checkpoint.pt`` with all the hashes and renames the directory into
place (an existing one is replaced only once the new one is complete). A crash leaves the old checkpoint.

Readers: :meth:`ctrkit.checkpoint.Checkpoint.load` reads such a directory as a single-process checkpoint of the
fused backend (the tables gathered whole; see ``checkpoint.read_sharded``), so evaluate, predict, export and serve
take it unchanged. :func:`load_sharded` loads it into a sharded model of any world size (DCP reshards).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from ctrkit.checkpoint import SHARDED_META, SHARDED_WEIGHTS, Checkpoint, TrainerState
from ctrkit.errors import CheckpointError
from ctrkit.io import file_sha256, replace_path, verify_files
from ctrkit.training.writer import CheckpointWriter

__all__ = ["ShardedCheckpointWriter", "load_sharded", "save_sharded"]


def _own_files(weights: Path, rank: int) -> dict[str, str]:
    """The DCP files rank ``rank`` wrote (``__<rank>_*``; rank 0 also the ``.metadata``) -> sha256."""
    names = [p for p in weights.iterdir() if p.name.startswith(f"__{rank}_")]
    if rank == 0:
        names += [p for p in weights.iterdir() if p.name == ".metadata"]
    return {p.name: file_sha256(p) for p in sorted(names)}


def _model_state(module: Any, prefix: str) -> dict[str, Any]:
    """The model's entries of the wrapped module's state dict (the model is its child ``prefix``, as in the
    trainer's TaskStep), under the model's own names; the same tensors, so loading into them is in place."""
    return {k[len(prefix):]: v for k, v in module.state_dict().items() if k.startswith(prefix)}


def save_sharded(path: str | Path, module: Any, meta: Checkpoint, *, plan: Any = None, prefix: str = "model.") -> Path:
    """Write ``module`` (a DistributedModelParallel around a module whose child ``prefix`` is the model) to the
    directory ``path`` from every rank (module docstring); ``meta`` is the checkpoint without weights (rank 0's is
    written). Collective: every rank calls it."""
    path = Path(path)
    rank, world = dist.get_rank(), dist.get_world_size()
    box = [str(path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"))] if rank == 0 else [None]
    dist.broadcast_object_list(box, src=0)
    tmp = Path(box[0])  # type: ignore[arg-type]
    weights = tmp / SHARDED_WEIGHTS
    try:
        state = {"model": _model_state(module, prefix)}
        fused = getattr(module, "fused_optimizer", None)
        if fused is not None:
            state["fused_optimizer"] = fused.state_dict()
        dcp.save(state, checkpoint_id=str(weights))
        hashes: list[Any] = [None] * world
        dist.all_gather_object(hashes, _own_files(weights, rank))
        if rank == 0:
            files = {k: v for h in hashes for k, v in h.items()}
            sharded = {"world_size": world, "files": files,
                       "sharding": _plan_summary(plan) if plan is not None else None}
            meta.weights = {}
            meta.extra = {**meta.extra, "sharded": sharded}
            meta.save(tmp / SHARDED_META)
            replace_path(tmp, path)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    dist.barrier()
    return path


def _plan_summary(plan: Any) -> dict[str, str]:
    return {f"{path}.{t}": ps.sharding_type for path, m in plan.plan.items() for t, ps in m.items()}


def load_sharded(path: str | Path, module: Any, *, optimizer: bool = True, prefix: str = "model.") -> Checkpoint:
    """Load the sharded checkpoint at ``path`` into ``module`` (a DistributedModelParallel of any world size: DCP
    reads each rank's shards from whichever files hold them), after checking every file's hash; the fused optimizer's
    state too when ``optimizer`` and the checkpoint has it. Returns the checkpoint's metadata (no weights)."""
    path = Path(path)
    meta = Checkpoint.load(path / SHARDED_META) if (path / SHARDED_META).is_file() else None
    if meta is None or "sharded" not in meta.extra:
        raise CheckpointError(f"{path} is not a sharded ctrkit checkpoint (no {SHARDED_META} with a shard list); "
                              "a single-file checkpoint loads with Checkpoint.load / load_state_dict")
    verify_files(path / SHARDED_WEIGHTS, meta.extra["sharded"]["files"], "sharded checkpoint")
    state: dict[str, Any] = {"model": _model_state(module, prefix)}
    fused = getattr(module, "fused_optimizer", None)
    if optimizer and fused is not None:
        state["fused_optimizer"] = fused.state_dict()
    dcp.load(state, checkpoint_id=str(path / SHARDED_WEIGHTS))  # in place: shards, replicated tensors
    if "fused_optimizer" in state:
        fused.load_state_dict(state["fused_optimizer"])
    return meta


def is_sharded_checkpoint(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / SHARDED_META).is_file() and (p / SHARDED_WEIGHTS).is_dir()


class ShardedCheckpointWriter(CheckpointWriter):
    """The trainer's writer for a sharded training module: ``best.pt`` / ``last.pt`` are sharded checkpoint
    directories written by every rank (``collective``: the trainer calls :meth:`write` on all of them); the
    dense optimizer's state (the same on every rank) goes in the metadata; reading for resume loads the shards
    in place (any world size) and hands the trainer the model's own state."""

    collective = True

    def __init__(self, base: CheckpointWriter, module: Any, plan: Any = None) -> None:
        self.__dict__.update(base.__dict__)
        self.module, self.plan = module, plan

    def write_to(self, path: str | Path, model: nn.Module, optimizer: Any, state: TrainerState | None) -> Path:
        meta = Checkpoint(self.model_name, {}, model_params=self.model_params, schema=self.schema, config=self.config,
                          pipeline=self.pipeline, extra=self.extra, trainer=state,
                          optimizer=optimizer.state_dict() if optimizer is not None else None,
                          vocab_files=self.vocab_files, vocab_path=self.vocab_path)
        return save_sharded(path, self.module, meta, plan=self.plan)

    def read(self, path: str | Path, map_location: str | torch.device = "cpu") -> Checkpoint:
        if not is_sharded_checkpoint(path):
            raise CheckpointError(f"{path} is not a sharded checkpoint; a run with sharded tables resumes from the "
                                  "last.pt directory it wrote")
        meta = load_sharded(path, self.module)
        meta.weights = self.module.module.model.state_dict()  # already loaded in place
        return meta
