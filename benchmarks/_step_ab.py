"""Training steps of several trainers alternated in one process, for the step A/B scripts
(attention_step_ab.py, dien_step_ab.py, zoo_step_ab.py): every arm trains on the same batches, and the order of
the arms flips every step, so drift in the machine's load reaches them alike; CPU seconds by ``time.process_time``
(run with one thread)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


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
