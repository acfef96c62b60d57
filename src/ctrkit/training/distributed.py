"""One run on several processes (DESIGN §8): the process group, the wrapped module, and exact gathered evaluation.

A job launched by torchrun (``ctrkit train --nproc-per-node N`` runs torchrun's launcher,
:mod:`ctrkit.jobs.launch`) finds RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT in its environment;
:func:`init_distributed` joins the process group (gloo on CPU, nccl on CUDA unless
``train.distributed.backend`` says otherwise) and returns the :class:`DistContext` the job and the
:class:`~ctrkit.training.trainer.Trainer` share. Without those variables it returns None and the run is the
ordinary one-process run.

- Data parallel: :func:`wrap_for_training` puts the task's loss inside a module (:class:`TaskStep`) and wraps it
  in DistributedDataParallel, so every model, ranking and retrieval alike, runs its forward through DDP and its
  gradients -- sparse embedding gradients included -- are averaged over the ranks in backward. Models built
  with the torchrec embedding backend are sharded by :mod:`ctrkit.training.sharding` instead.
- Evaluation: each rank scores its round-robin share of the held-out batches (batch i on rank i mod W);
  :meth:`DistContext.gather_batches` puts every rank's per-batch results back in batch order, so the metrics are
  computed over exactly the rows, in exactly the order, of the one-process evaluation: the same numbers, not an
  average of per-rank values. Every rank computes them, so early stopping decides alike everywhere.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import inspect
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn

from ctrkit.batch import Batch
from ctrkit.errors import ConfigError
from ctrkit.models.base import CTRModel

log = logging.getLogger(__name__)

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistContext:
    """This process's place in a multi-process run: its rank among ``world_size``, its device and the backend."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes metrics, checkpoints, summaries and reports."""
        return self.rank == 0

    def barrier(self) -> None:
        dist.barrier()

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def gather_batches(self, mine: Sequence[Any]) -> list[Any]:
        """The per-batch results of all ranks in one process's batch order, given this rank's results of its
        round-robin share (batch i on rank i mod world size, as an evaluation :class:`BatchLoader` deals them)."""
        shares = self.all_gather_object(list(mine))
        total = sum(len(s) for s in shares)
        for r, s in enumerate(shares):
            want = len(range(r, total, self.world_size))
            if len(s) != want:
                raise RuntimeError(f"rank {r} evaluated {len(s)} batches where its round-robin share of {total} "
                                   f"batches is {want}: the evaluation loaders are not dealt alike")
        return [shares[i % self.world_size][i // self.world_size] for i in range(total)]

    def gather_items(self, v: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Every rank's item vectors ``v`` (B_r, D) and ids (B_r,), concatenated in rank order with gradients
        flowing back to the rank that computed them (torch.distributed.nn's all_gather); ranks with fewer rows are
        padded with id -1. -> (vectors (W x max B_r, D), ids, the row where this rank's items start)."""
        from torch.distributed.nn.functional import all_gather as all_gather_grad

        sizes = torch.tensor([v.shape[0]], device=v.device)
        every = [torch.zeros_like(sizes) for _ in range(self.world_size)]
        dist.all_gather(every, sizes)
        most = int(max(int(s.item()) for s in every))
        pad = most - v.shape[0]
        if pad:
            v = torch.cat([v, v.new_zeros(pad, v.shape[1])])
            ids = torch.cat([ids, ids.new_full((pad,), -1)])
        ids_all = [torch.empty_like(ids) for _ in range(self.world_size)]
        dist.all_gather(ids_all, ids)
        return torch.cat(all_gather_grad(v)), torch.cat(ids_all), self.rank * most

    def step_totals(self, loss: torch.Tensor, rows: int) -> tuple[torch.Tensor, int]:
        """(the mean of a step's loss over the ranks, the rows all ranks trained on): one all-reduce."""
        out = torch.stack([loss.detach().float(), torch.tensor(float(rows), device=loss.device)])
        dist.all_reduce(out)
        return out[0] / self.world_size, int(out[1].item())


def launched() -> bool:
    """Whether this process was started by torchrun (or another launcher setting its variables)."""
    return all(v in os.environ for v in ("RANK", "WORLD_SIZE"))


def init_distributed(backend: str = "auto", device: str = "cpu", timeout_s: float = 300.0) -> DistContext | None:
    """Join the process group of a launched run (None when not launched). ``device`` is ``train.device``: on
    CUDA each process takes the GPU of its local rank. A process group already set up by the caller is used
    as it is (the caller keeps it); otherwise the job owns it and :func:`shutdown` ends it."""
    if not launched():
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"train.device={device} but this machine has no usable CUDA GPU; use train.device=cpu")
        if local >= torch.cuda.device_count():
            raise ConfigError(f"local rank {local} has no GPU: this machine has {torch.cuda.device_count()}; start "
                              "at most that many processes per node (--nproc-per-node)")
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    name = ("nccl" if dev.type == "cuda" else "gloo") if backend == "auto" else backend
    if name == "nccl" and dev.type != "cuda":
        raise ConfigError("train.distributed.backend=nccl needs train.device=cuda; on CPU use gloo (or auto)")
    if not dist.is_initialized():
        dist.init_process_group(name, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=float(timeout_s)))
        _OWNED.append(True)
    elif dist.get_backend() != name:
        log.warning("the process group was set up with %s, not %s; using it as it is", dist.get_backend(), name)
        name = str(dist.get_backend())
    ctx = DistContext(rank, world, local, name, dev)
    log.info("rank %d of %d (local rank %d) on %s, backend %s", rank, world, local, dev, name)
    return ctx


_OWNED: list[bool] = []  # whether init_distributed set up the process group (so shutdown ends it)


def shutdown() -> None:
    """End the process group that :func:`init_distributed` set up (one the caller set up stays)."""
    if _OWNED and dist.is_initialized():
        dist.destroy_process_group()
    _OWNED.clear()


def end_worker_process(code: int = 0) -> NoReturn:
    """End this worker process with exit status ``code`` without the interpreter's finalization: run the exit
    handlers, let go of unreferenced objects (open files flush as they close), flush logging and the standard
    streams, then ``os._exit``. Why: a process group that DDP or torchrec's sharded modules used is never freed
    (they keep it in a reference cycle in C++), so gloo's worker threads are still alive when Python finalizes; a
    native thread that then needs the GIL -- to drop a tensor that Python once held, say -- is made to exit by the
    interpreter from inside C++ code, which kills the process with "terminate called without an active exception"
    (SIGABRT) after a run that succeeded. Only for a process started to be a rank (torchrun's or a spawned one):
    the caller owns the process."""
    try:
        atexit._run_exitfuncs()  # what the interpreter would run first at exit (ctrkit.background.stop_all, ...)
        gc.collect()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    finally:
        os._exit(code)


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter or buffer (CPU without any); tensors on the meta device -- torchrec
    tables that sharding allocates later (:mod:`ctrkit.training.sharding`) -- do not count."""
    return next((t.device for t in [*model.parameters(), *model.buffers()] if not t.is_meta), torch.device("cpu"))


class TaskStep(nn.Module):
    """The task's loss of the model on a batch, as a module: what DDP wraps, so that every task's forward (a
    retrieval task's query and item towers included) runs through the wrapper."""

    def __init__(self, model: CTRModel, task: Any) -> None:
        super().__init__()
        self.model = model
        self.task = task

    def declare_sparse_gradients(self) -> None:
        """Tell DDP which parameters get sparse gradients: the fused tables of every embedding collection with
        ``sparse_grad`` (its ``sparse_grad_parameters()`` where it has them: small tables get dense ones). DDP recognises them only on modules of type nn.Embedding / nn.EmbeddingBag (it would
        copy a sparse gradient into a dense bucket and fail), so each such table is also registered, first, on
        an nn.EmbeddingBag that is never called (``sparse_tables``, the same Parameter objects: DDP takes a
        parameter from the first module that holds it). The model's own parameters and state dict do not change."""
        holders = nn.ModuleList()
        for module in self.model.modules():
            if getattr(module, "sparse_grad", False) and hasattr(module, "embedding_parameters"):
                params = getattr(module, "sparse_grad_parameters", module.embedding_parameters)
                for p in params():
                    holder = nn.EmbeddingBag(1, 1, sparse=True)
                    holder.weight = p
                    holders.append(holder)
        modules = self._modules
        self._modules = {"sparse_tables": holders, **{k: v for k, v in modules.items() if k != "sparse_tables"}}

    def forward(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.task.loss(self.model, batch)


def wrap_for_training(model: CTRModel, task: Any, ctx: DistContext | None, config: Any) -> nn.Module:
    """The module the training loop calls: :class:`TaskStep` of ``model`` and ``task``; under a
    :class:`DistContext`, wrapped in DistributedDataParallel (or sharded by torchrec when the model's tables are
    of the torchrec backend). ``config`` is the run's :class:`~ctrkit.training.config.TrainConfig`."""
    step = TaskStep(model, task)
    if ctx is None:
        return step
    if config.distributed.gather_negatives and hasattr(task, "gather_items"):
        task.gather_items = ctx.gather_items
    from ctrkit.training.sharding import shard_model, uses_torchrec

    if uses_torchrec(model):
        return shard_model(step, ctx, config)
    step.declare_sparse_gradients()
    # buffers (e.g. batch-norm statistics) stay each rank's own between steps: newer torch names the option anew
    ddp = nn.parallel.DistributedDataParallel
    buffers = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(ddp).parameters
               else {"broadcast_buffers": False})
    return ddp(step, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
               # models whose parts are not all used in every step (an aux loss on some batches, a skipped tower)
               find_unused_parameters=True, **buffers)
