"""Training steps of several trainers alternated in one process, for the step A/B scripts
(attention_step_ab.py, dien_step_ab.py, zoo_step_ab.py), and the trainers they build alike: every arm trains on the same batches, and the order of
the arms flips every step, so drift in the machine's load reaches them alike; CPU seconds by ``time.process_time``
(run with one thread)."""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

BASE_OVERRIDES = ("train.seed=0", "train.epochs=1", "train.ema_decay=null", "train.progress=false")



def module_at(rev: str, path: str) -> ModuleType:
    """The source file ``path`` (relative to the repository root) as it is at git revision ``rev``, imported as a
    module of its own (the baseline side of a step A/B)."""
    repo = Path(__file__).resolve().parent.parent
    text = subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{path}"], check=True, capture_output=True,
                          text=True).stdout
    name = f"{Path(path).stem}_at_{rev.replace('/', '_')}"
    file = Path(tempfile.mkdtemp()) / f"{name}.py"
    file.write_text(text)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module

def build_trainer(store: Path, config: Path, *, overrides: Sequence[str] = (), matched_l2: bool = False,
                  patch: Callable[[Any], None] | None = None) -> tuple[Any, Any]:
    """(a Trainer of ``config`` on ``store``'s train split, its loader): seed 0, one epoch, no weight average, no
    progress bar, then ``overrides``; the loader shuffles with seed 0 and prefetches nothing. ``matched_l2``:
    the embedding L2 per row of deepctr_compare.py's matched recipe; ``patch(model)`` runs on the model before
    the Trainer takes it."""
    from ctrkit.data.storage.loader import BatchLoader
    from ctrkit.data.storage.store import Store
    from ctrkit.jobs.common import seed_everything
    from ctrkit.models.registry import create_model
    from ctrkit.training.config import load_config
    from ctrkit.training.trainer import Trainer

    cfg = load_config(config, [*BASE_OVERRIDES, *overrides])
    if matched_l2:
        cfg.train.embedding_l2 = 2e-5 / cfg.data.batch_size
    loader = BatchLoader(Store(str(store / "train")), cfg.data.batch_size, shuffle=True, seed=0, prefetch=0)
    seed_everything(0)
    model = create_model(cfg.model.name, loader.store.schema, **cfg.model.params)
    if patch is not None:
        patch(model)
    return Trainer(model, loader, cfg.train), loader


def plain_step(trainer: Any, batch: Any) -> None:
    """Forward, loss, backward and the optimizer's step of a ``Trainer``, nothing else."""
    loss, _ = trainer.module(batch)
    trainer.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    trainer.optimizer.step()


def alternate(trainers: Mapping[str, Any], batches: Sequence[Any], steps: int, warmup: int = 0, *,
              step: Callable[[Any, Any], None] = plain_step,
              before: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """``warmup + steps`` rounds, each one ``step(trainer, batch)`` per arm in alternating order -> each arm's
    CPU seconds of the rounds after ``warmup``. ``before(name)``, if given, runs untimed before an arm's step
    (to swap in the code that arm runs)."""
    names = list(trainers)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for i in range(warmup + steps):
        batch = batches[i % len(batches)]
        for name in names if i % 2 else names[::-1]:
            if before is not None:
                before(name)
            c0 = time.process_time()
            step(trainers[name], batch)
            if i >= warmup:
                seconds[name].append(time.process_time() - c0)
    return seconds


def cpu_ms(fn: Callable[[], None], reps: int = 20) -> float:
    """The median CPU milliseconds (``time.process_time``) of ``reps`` calls of ``fn``."""
    out = []
    for _ in range(reps):
        c = time.process_time()
        fn()
        out.append((time.process_time() - c) * 1e3)
    return statistics.median(out)


def native_kernels(on: bool) -> None:
    """Turn ctrkit's native kernels on or off for the calls that follow (``CTRKIT_NATIVE_KERNELS``, read per call)."""
    os.environ["CTRKIT_NATIVE_KERNELS"] = "1" if on else "0"


def max_weight_difference(a: Any, b: Any) -> float:
    """The largest absolute difference between two models' parameters (``a``, ``b``: nn.Modules of one shape)."""
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True))
