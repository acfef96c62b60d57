"""What the data-parallel tests run in other processes: gloo workers (torch.multiprocessing spawn), and the fault
that kills one torchrun worker at a given step (installed through a sitecustomize module, see kill_module)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ctrkit.checkpoint import Checkpoint
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store
from ctrkit.training.distributed import DistContext
from ctrkit.training.tasks import CTRTask


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def evaluate_share(rank: int, world: int, port: int, checkpoint: str, store: str, metrics: list[str],
                   batch: int, out: str) -> None:
    """Rank ``rank`` of ``world``: the checkpoint's model on its round-robin share of ``store``, gathered; rank 0
    saves the metrics to ``out`` (a .npy of a dict)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        ctx = DistContext(rank, world, rank, "gloo", torch.device("cpu"))
        ckpt = Checkpoint.load(checkpoint)
        model = ckpt.build_model()
        loader = BatchLoader(Store(store), batch, shuffle=False, prefetch=0, pipeline=ckpt.feature_pipeline(),
                             rank=rank, world_size=world, even_tail=False)
        got = CTRTask(metrics).bind(model).evaluate(model, loader, ctx.gather_batches)
        if rank == 0:
            np.save(out, got, allow_pickle=True)
    finally:
        dist.destroy_process_group()


KILL_SOURCE = """
import os, signal
if os.environ.get("RANK") == "{rank}" and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
    from ctrkit.training import trainer as _t
    _after = _t.Trainer._after_step
    def _after_step(self, tick, loss):
        if self.progress.step == {step}:
            os.kill(os.getpid(), signal.SIGKILL)
        return _after(self, tick, loss)
    _t.Trainer._after_step = _after_step
"""


def kill_module(where: Path, rank: int, step: int) -> Path:
    """A directory holding a sitecustomize.py that, put first on PYTHONPATH, makes worker ``rank`` of a
    torchrun job's first attempt kill itself (SIGKILL) after training step ``step``."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "sitecustomize.py").write_text(KILL_SOURCE.format(rank=rank, step=step))
    return where
