"""Weight averaging: an exponential moving average (EMA) of the weights over training steps.

``train.ema_decay = d`` keeps, besides the trained weights w_t, their average

    a_t = (1 - d) * sum_{k=1..t} d^(t-k) w_k / (1 - d^t)

(an EMA started at zero and divided by 1 - d^t, as Adam debiases its moments, so a_t weighs the steps
already taken and nothing else; 1 / (1 - d) is its window in steps). Evaluation, checkpoints (best.pt,
last.pt: their ``model_state``), test scoring and export use a_t; training goes on from w_t. At the end
of ``fit`` the model keeps a_t, as Keras's ``use_ema`` does. Late in a run the steps of one mini-batch
move the weights by noise that does not decrease the loss; their average is a point nearer the middle
of that noise, so runs with different seeds (init, batch order) land closer together (measured in
benchmarks/deepctr_compare.py).

Embedding tables are averaged lazily, row by row, so a step costs what the rows of its batch cost,
not the table. A row that the batch does not touch keeps its weight, and for k steps of a constant
weight w the average moves in closed form, ``acc <- d^k acc + (1 - d^k) w``; so each row remembers the
step up to which its accumulator is current and is brought up to date just before the optimizer
changes it (and all rows when the average is read). This is exact for the embedding optimizers, which
change only the rows of the batch (SparseAdam, Adagrad and row-wise Adagrad, SGD without momentum).

A checkpoint holds a_t as the model's weights and w_t in the trainer state (``raw``): that is all a
resume needs, because after the catch-up every accumulator is a_t * (1 - d^t).

:meth:`WeightAverage.start_at_weights` (a warm start's ``train.warm_start_average: start``) counts the model's
weights w_0 as the whole past instead: a_t = d^t w_0 + (1 - d) * sum_{k=1..t} d^(t-k) w_k, not debiased, so early
in the run the average stays near w_0 (after t steps w_0 still weighs d^t).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ctrkit.errors import ConfigError, TrainingError
from ctrkit.training.optim import coalesce_rows, nonzero_rows


def check_decay(decay: float) -> float:
    """``train.ema_decay`` as a float in (0, 1), or a ConfigError saying what to use."""
    if isinstance(decay, bool) or not isinstance(decay, int | float) or not 0.0 < float(decay) < 1.0:
        raise ConfigError(f"train.ema_decay={decay!r} must lie strictly between 0 and 1: the average spans about "
                          "1 / (1 - decay) steps (0.99: the last ~100 steps); leave it out (null) to train without "
                          "weight averaging")
    return float(decay)


class WeightAverage:
    """The debiased EMA of ``model``'s trainable parameters (see the module docstring).

    ``row_params`` are the embedding tables (the parameters of the embedding optimizer): averaged row by
    row, lazily. Call :meth:`before_step` after ``backward()`` and before the optimizer step (it reads the
    gradients to know the rows of the batch) and :meth:`after_step` after it.
    """

    def __init__(self, model: nn.Module, decay: float, row_params: Iterable[torch.Tensor] = ()) -> None:
        self.decay = check_decay(decay)
        rows = {id(p) for p in row_params}
        self.names: list[str] = []
        self.params: list[torch.Tensor] = []
        seen: set[int] = set()
        for name, p in model.named_parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                self.names.append(name)
                self.params.append(p)
        self.acc = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in self.params]
        self.row_index = [i for i, p in enumerate(self.params) if id(p) in rows and p.dim() >= 1]
        row_set = set(self.row_index)
        self.full_index = [i for i in range(len(self.params)) if i not in row_set]
        # per row of a table: the number of updates its accumulator includes
        self.current = {i: torch.zeros(self.params[i].shape[0], dtype=torch.long, device=self.params[i].device)
                        for i in self.row_index}
        self.updates = 0
        self._touched: dict[int, torch.Tensor] = {}
        self._raw: list[torch.Tensor] | None = None  # the trained weights while the average is applied
        self.debias = True  # False after start_at_weights(): the starting weights are the average's whole past
        self.finalized = False  # finalize() ran: the model holds the average for good

    # ---- training steps ----------------------------------------------------------------------------------
    @torch.no_grad()
    def before_step(self) -> None:
        """Bring the rows the optimizer is about to change up to date (their weight has been constant
        since their accumulator was last current)."""
        self._touched = {}
        for i in self.row_index:
            p = self.params[i]
            if p.grad is None:
                continue
            if p.grad.is_sparse:  # coalesced once, here: the optimizer's own coalescing is then a no-op
                p.grad = coalesce_rows(p.grad)
                rows = p.grad.indices()[0]
            else:
                rows = nonzero_rows(p.grad)
            if rows.numel():
                self._catch_up(i, rows)
                self._touched[i] = rows

    @torch.no_grad()
    def after_step(self) -> None:
        """Fold the weights after this optimizer step into the average."""
        if self._raw is not None:
            raise TrainingError("an optimizer step ran while the averaged weights were applied")
        self.updates += 1
        full = self.full_index
        if full:
            torch._foreach_lerp_([self.acc[i] for i in full], [self.params[i].detach() for i in full], 1.0 - self.decay)
        for i, rows in self._touched.items():
            acc = self.acc[i]
            acc.index_copy_(0, rows, torch.lerp(acc[rows], self.params[i].detach()[rows], 1.0 - self.decay))
            self.current[i][rows] = self.updates
        self._touched = {}

    def _catch_up(self, i: int, rows: torch.Tensor | None = None) -> None:
        """acc <- d^k acc + (1 - d^k) w for the rows (all if None) whose accumulator misses k updates."""
        p, acc, cur = self.params[i].detach(), self.acc[i], self.current[i]
        if rows is not None:
            p, acc_rows, cur_rows = p[rows], acc[rows], cur[rows]
        else:
            acc_rows, cur_rows = acc, cur
        behind = (self.updates - cur_rows).to(acc.dtype)
        keep = torch.pow(torch.tensor(self.decay, dtype=acc.dtype, device=acc.device), behind)
        keep = keep.view(-1, *([1] * (acc.dim() - 1)))
        caught_up = acc_rows * keep + p * (1.0 - keep)
        if rows is None:
            acc.copy_(caught_up)
            cur.fill_(self.updates)
        else:
            acc.index_copy_(0, rows, caught_up)
            cur[rows] = self.updates

    @torch.no_grad()
    def start_at_weights(self) -> None:
        """a_0 = the model's weights now (a warm start's, grown), counted as the whole past: no debiasing, so
        a_t = d^t w_0 + (1 - d) sum_k d^(t-k) w_k (``train.warm_start_average: start``). Before any step."""
        if self.updates:
            raise TrainingError(f"start_at_weights() after {self.updates} averaged steps: call it before training")
        for acc, p in zip(self.acc, self.params, strict=True):
            acc.copy_(p.detach())
        self.debias = False

    def accumulated_weight(self, updates: int) -> float:
        """1 - d^updates (the accumulators' weight) or 1 when the average started at weights."""
        return 1.0 - self.decay ** updates if self.debias else 1.0

    # ---- reading the average -----------------------------------------------------------------------------
    @torch.no_grad()
    def averaged(self) -> list[torch.Tensor]:
        """a_t of every parameter (new tensors); the trained weights themselves before the first step."""
        if self.updates == 0:
            return [p.detach().clone() for p in self.params]
        for i in self.row_index:
            self._catch_up(i)
        scale = 1.0 / self.accumulated_weight(self.updates)
        return [acc * scale for acc in self.acc]

    @property
    def applied(self) -> bool:
        return self._raw is not None

    @contextmanager
    def applied_weights(self) -> Iterator[None]:
        """The model holds a_t inside the block and its trained weights again after it (re-entrant)."""
        if self._raw is not None:
            yield
            return
        averaged = self.averaged()
        with torch.no_grad():
            self._raw = [p.detach().clone() for p in self.params]
            for p, a in zip(self.params, averaged, strict=True):
                p.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, r in zip(self.params, self._raw, strict=True):
                    p.copy_(r)
            self._raw = None

    @torch.no_grad()
    def finalize(self) -> None:
        """Leave a_t in the model for good (the end of training)."""
        if self._raw is not None:
            raise TrainingError("finalize() inside applied_weights()")
        for p, a in zip(self.params, self.averaged(), strict=True):
            p.copy_(a)
        self.finalized = True

    # ---- checkpoints ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a resume needs besides the checkpoint's model_state (a_t): the decay, the number of
        updates and the trained weights w_t (cloned; taken from before :meth:`applied_weights`)."""
        raw = self._raw if self._raw is not None else [p.detach() for p in self.params]
        return {"decay": self.decay, "updates": self.updates, "debias": self.debias,
                "raw": {n: r.detach().clone() for n, r in zip(self.names, raw, strict=True)}}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the model must hold the checkpoint's model_state (a_t) when this is called; the
        accumulators become a_t * (1 - d^t) and the model gets its trained weights back."""
        if abs(float(state["decay"]) - self.decay) > 1e-12:
            raise TrainingError(f"the checkpoint averaged its weights with train.ema_decay={state['decay']}, this run "
                                f"asks for {self.decay}; resume with the checkpoint's value (the average so far "
                                "was taken with it)")
        raw = state["raw"]
        missing = [n for n in self.names if n not in raw]
        if missing:
            raise TrainingError(f"the checkpoint's averaging state lacks the trained weights of {missing[:5]}")
        self.updates, self.debias = int(state["updates"]), bool(state.get("debias", True))
        scale = self.accumulated_weight(self.updates)
        for i, (name, p) in enumerate(zip(self.names, self.params, strict=True)):
            self.acc[i].copy_(p.detach() * scale)
            p.copy_(raw[name].to(p.device))
        for cur in self.current.values():
            cur.fill_(self.updates)

