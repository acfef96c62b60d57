"""Optimizers by parameter group: dense parameters, embedding tables (sparse-aware), dedicated groups.

The model's declared ``embedding_parameters()`` (embedding tables [R, D]) go to the sparse optimizer,
everything else to the dense one:

- dense: ``adam`` | ``adamw`` | ``sgd`` | ``adagrad`` with ``weight_decay`` (L2 added to the gradient;
  decoupled decay for adamw); Adam / AdamW use torch's fused kernel (one pass over every parameter) where they
  are float tensors on CPU or CUDA, else its multi-tensor (foreach) one. Measured on FiBiNET's dense
  parameters (2.8M, one thread): 63 ms per Adam step one tensor at a time (torch's CPU default), 24 ms
  foreach (bit-identical), 13 ms fused (differs by rounding, ~1e-8).
- embeddings: ``adagrad`` (torch.optim.Adagrad), ``sparse_adam`` (:class:`LazyAdam`: torch.optim.SparseAdam's
  update and state, computed with dense row gathers / index_add instead of sparse tensor ops), ``sgd``
  (torch.optim.SGD) or ``rowwise_adagrad`` (:class:`RowWiseAdagrad`, fbgemm's row-wise Adagrad: one
  accumulator per row). All four accept sparse COO gradients (``embedding_bag(sparse=True)``) and
  dense ones (a dense gradient's all-zero rows count as "not touched").

Embedding L2 is mini-batch aware (DIN, seed 002 "mini batch aware regularization"): only rows
touched by the batch are penalised, ``g_r <- g_r + embedding_l2 * W_r`` for every row r with a
gradient, i.e. the gradient of ``embedding_l2 / 2 * sum_{r in batch} ||W_r||^2``. It is applied by
:class:`OptimizerSet` to the coalesced gradient just before the sparse optimizer steps, so it
works identically for every sparse optimizer and never walks the whole table. (DIN additionally
divides by each id's frequency; that variant is not implemented.)

Dedicated groups: a model declares named :class:`~ctrkit.models.base.ParamGroup` s; with
``train.wide_optimizer=ftrl`` the groups declared with ``optimizer="ftrl"`` (Wide & Deep's "wide" linear
part) are trained by :class:`~ctrkit.training.ftrl.FTRL` and taken out of the dense / sparse optimizers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ctrkit.errors import ConfigError
from ctrkit.models.base import CTRModel
from ctrkit.nn import embedding_update

DENSE_OPTIMIZERS = ("adam", "adamw", "sgd", "adagrad")
SPARSE_OPTIMIZERS = ("adagrad", "rowwise_adagrad", "sparse_adam", "sgd")
DENSE_COALESCE_RATIO = 4  # coalesce_rows: counting while R <= 4 x lookups, else a sort


def split_parameters(model: CTRModel) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(dense params, embedding params) of trainable parameters in the model's order, shared tables
    counted once; embedding params are the model's declared ``embedding_parameters()``."""
    marked = {id(p) for p in model.embedding_parameters()}
    dense, emb = [], []
    for p in model.parameters():
        if p.requires_grad:
            (emb if id(p) in marked else dense).append(p)
    return dense, emb


def coalesce_rows(grad: torch.Tensor) -> torch.Tensor:
    """A sparse COO gradient of an [R, D] table with each row's duplicates summed (coalesced).

    When the table has at most ``DENSE_COALESCE_RATIO`` times as many rows as the batch made lookups (a
    sequence feature over a small item table; the DLRM benchmark's 189,823 fused rows against 106,496
    lookups), the touched rows are found by counting (``bincount``, their places by a ``cumsum``) and the row
    gradients summed in lookup order into an [R', D] buffer (the native loop of :mod:`ctrkit.nn.embedding_update`,
    ``index_add_``'s floats: 2.2 of 120 ms less per DLRM benchmark step, one thread), instead of sorting the ids:
    0.29 / 0.85 ms against ``coalesce()``'s 0.60 / 1.97 at R = n = 6,656 / 20,000 lookups, 0.35 / 1.14 against
    0.57 / 1.93 at R = 4n (D = 16, one thread). Otherwise, and for tensors already coalesced, ``coalesce()``.
    """
    if not grad.is_sparse or grad.is_coalesced() or grad.sparse_dim() != 1:
        return grad.coalesce() if grad.is_sparse else grad
    rows, values = grad._indices()[0], grad._values()
    n = grad.shape[0]
    if n > DENSE_COALESCE_RATIO * rows.numel():
        return grad.coalesce()
    hit = torch.bincount(rows, minlength=n) > 0  # (R,)
    touched = hit.nonzero().squeeze(1)  # (R',) ascending
    slot = hit.cumsum(0).sub_(1).index_select(0, rows)  # (nnz,) each id's place among the touched rows
    summed = embedding_update.scatter_rows(touched.numel(), values, slot) if values.dim() == 2 else None  # (R', D)
    if summed is None:
        summed = values.new_zeros((touched.numel(), *values.shape[1:])).index_add_(0, slot, values)
    return torch.sparse_coo_tensor(touched[None], summed, grad.shape, is_coalesced=True, check_invariants=False)


def _touched_rows(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows [R'], summed row gradients [R', D]) of a sparse or dense gradient of a [R, D] table.

    A sparse gradient is coalesced (duplicate ids of one batch summed); for a dense gradient the
    touched rows are those with any non-zero entry.
    """
    if grad.is_sparse:
        g = coalesce_rows(grad)
        return g.indices()[0], g.values()
    rows = nonzero_rows(grad)
    return rows, grad[rows]


def nonzero_rows(grad: torch.Tensor) -> torch.Tensor:
    """The rows (R',) ascending of a dense [R, ...] table gradient with any non-zero entry."""
    return touched_mask(grad).nonzero().squeeze(1)


def touched_mask(grad: torch.Tensor) -> torch.Tensor:
    """(R,) bool: the rows of a dense [R, ...] table gradient with any non-zero (or NaN) entry. Summed absolute
    values by a matrix-vector product: 3-4x faster than ``ne(0).any(1)`` over rows of 16 (one thread)."""
    flat = grad.reshape(grad.shape[0], -1)
    return torch.mv(flat.abs(), flat.new_ones(flat.shape[1])).ne(0)


class RowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad for embedding tables W [R, D] (fbgemm ``EXACT_ROWWISE_ADAGRAD``).

    For every row r touched by the batch, with g_r the summed (coalesced) gradient of the row:
    ``G_r += mean_d(g_r[d]^2)``, ``W_r -= lr * g_r / (sqrt(G_r) + eps)``. One float of state per
    row instead of D (Adagrad). Untouched rows and their accumulators are left unchanged.
    Accepts sparse COO or dense gradients.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-2, eps: float = 1e-8) -> None:
        if lr <= 0 or eps < 0:
            raise ValueError(f"RowWiseAdagrad needs lr > 0 and eps >= 0, got lr={lr}, eps={eps}")
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, eps = group["lr"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dim() != 2:
                    raise ValueError(f"RowWiseAdagrad updates 2-D embedding tables, got shape {tuple(p.shape)}")
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["sum"] = torch.zeros(p.shape[0], dtype=torch.float32, device=p.device)
                rows, g = _touched_rows(p.grad)  # (R',), (R', D)
                acc = state["sum"]
                acc.index_add_(0, rows, g.float().pow(2).mean(1))
                scale = acc[rows].sqrt().add_(eps)  # (R',)
                p.index_add_(0, rows, (g / scale[:, None]).to(p.dtype), alpha=-lr)
                state["step"] += 1
        return loss


def add_touched_row_l2_(p: torch.Tensor, l2: float) -> None:
    """``grad_r += l2 * W_r`` for the rows r of ``p.grad`` that the batch touched (in place): a sparse gradient
    is replaced by its coalesced version; a dense one is updated on its non-zero rows only."""
    if p.grad is None or l2 == 0:
        return
    with torch.no_grad():
        if p.grad.is_sparse:
            g = coalesce_rows(p.grad)
            rows = g.indices()[0]
            values = g.values() + l2 * p[rows]
            p.grad = torch.sparse_coo_tensor(g.indices(), values, g.shape, is_coalesced=True, check_invariants=False)
        else:  # every row at once, the untouched ones' zero gradients kept (a dense gradient: a small table)
            p.grad.addcmul_(p, _row_mask(p.grad), value=l2)


def _row_sparse(grad: torch.Tensor) -> torch.Tensor:
    """A dense [R, D] gradient as a coalesced sparse COO tensor of its non-zero rows."""
    rows, values = _touched_rows(grad)
    return torch.sparse_coo_tensor(rows[None], values, grad.shape, is_coalesced=True, check_invariants=False)


class LazyAdam(torch.optim.SparseAdam):
    """Lazy Adam on embedding tables: torch.optim.SparseAdam's update, state and state dict, computed on the
    touched rows r with row gathers and ``index_add_`` (torch's builds sparse tensors and ``sparse_mask`` s
    twice per table and step). With g_r the coalesced row gradient, every float operation in torch's order::

        m_r += (1 - b1) (g_r - m_r);   v_r += (1 - b2) (g_r^2 - v_r)
        W_r -= lr sqrt(1 - b2^t) / (1 - b1^t) * m_r / (sqrt(v_r) + eps)

    so the weights are bit-identical to torch's (tests/training/test_optim.py). Accepts sparse COO or dense
    gradients (a dense gradient's all-zero rows are not touched). Untouched rows and their moments keep
    their values: the step counter is per table, as in torch. A dense gradient first gets ``dense_grad_l2``'s
    touched-row L2 (:func:`add_touched_row_l2_`; OptimizerSet's ``embedding_l2``), both in one native pass on the CPU
    (:mod:`ctrkit.nn.embedding_update`: the same floats but a correctly rounded sqrt, where ATen's is 1 ulp off).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, maximize: bool = False) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, maximize=maximize)
        self.dense_grad_l2 = 0.0

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:  # as torch's SparseAdam: an int step, moments shaped like the table
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                step = state["step"]
                step_size = group["lr"] * math.sqrt(1 - beta2**step) / (1 - beta1**step)
                moments = (state["exp_avg"], state["exp_avg_sq"])
                args = (beta1, beta2, group["eps"], step_size, group.get("maximize", False))
                if p.grad.is_sparse:
                    _lazy_adam_rows(p, p.grad, *moments, *args)
                elif not embedding_update.lazy_adam_rows_(p, p.grad, *moments, self.dense_grad_l2, *args):
                    add_touched_row_l2_(p, self.dense_grad_l2)
                    _lazy_adam_masked(p, p.grad, *moments, *args)
        return loss


def _lazy_adam_rows(p: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, beta1: float,
                    beta2: float, eps: float, step_size: float, maximize: bool) -> None:
    """LazyAdam's update of the touched rows of ``p``, gathered (a sparse gradient: a large table)."""
    rows, g = _touched_rows(grad)  # (R',), (R', D)
    if rows.numel() == 0:
        return
    if maximize:
        g = -g
    old_m, old_v = m.index_select(0, rows), v.index_select(0, rows)  # (R', D)
    new_m = g.sub(old_m).mul_(1 - beta1).add_(old_m)  # m + (1 - b1)(g - m), torch's order
    new_v = g.pow(2).sub_(old_v).mul_(1 - beta2).add_(old_v)
    m.index_copy_(0, rows, new_m)
    v.index_copy_(0, rows, new_v)
    p.index_add_(0, rows, new_m.div_(new_v.sqrt().add_(eps)).mul_(-step_size))


def _lazy_adam_masked(p: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, beta1: float,
                      beta2: float, eps: float, step_size: float, maximize: bool) -> None:
    """LazyAdam's update on a dense gradient (a small table, :mod:`ctrkit.nn.embedding_grad`): every row
    computed with the float operations of :func:`_lazy_adam_rows`, then kept only where the row was touched
    (a non-zero gradient row). Cheaper than gathering and scattering rows when the table is small."""
    touched = _row_mask(grad)  # (R, 1): 1 on touched rows, 0 elsewhere (x + 0 * y == x, x + 1 * y == x + y)
    g = -grad if maximize else grad
    dm = g.sub(m).mul_(1 - beta1)  # (R, D)
    dv = g.pow(2).sub_(v).mul_(1 - beta2)
    denom = dv.add(v).sqrt_().add_(eps)
    update = dm.add(m).div_(denom).mul_(-step_size)
    m.addcmul_(dm, touched)
    v.addcmul_(dv, touched)
    p.addcmul_(update, touched)


def _row_mask(grad: torch.Tensor) -> torch.Tensor:
    """(R, 1, ...) of the gradient's dtype: 1 on the touched rows of a dense [R, ...] gradient, 0 elsewhere."""
    return touched_mask(grad).to(grad.dtype).view(-1, *([1] * (grad.dim() - 1)))


class OptimizerSet:
    """A dense and a sparse optimizer stepped together, with one checkpointable state.

    ``step()`` applies the mini-batch-aware embedding L2, converts dense embedding gradients to
    row-sparse ones where the optimizer needs it (SparseAdam), then steps both optimizers.
    """

    def __init__(
        self,
        dense: torch.optim.Optimizer | None,
        sparse: torch.optim.Optimizer | None,
        embedding_l2: float = 0.0,
        wide: torch.optim.Optimizer | None = None,
    ) -> None:
        self.dense = dense
        self.sparse = sparse
        self.wide = wide  # e.g. FTRL over the parameter groups declared with optimizer="ftrl"
        self.embedding_l2 = float(embedding_l2)
        # torch's SparseAdam refuses dense gradients; LazyAdam (a SparseAdam) takes either, adding their L2 itself
        self._needs_sparse_grad = isinstance(sparse, torch.optim.SparseAdam) and not isinstance(sparse, LazyAdam)
        if isinstance(sparse, LazyAdam):
            sparse.dense_grad_l2 = self.embedding_l2

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for o in (self.dense, self.sparse, self.wide) if o is not None]

    @property
    def dense_params(self) -> list[torch.Tensor]:
        return [p for g in self.dense.param_groups for p in g["params"]] if self.dense else []

    @property
    def embedding_params(self) -> list[torch.Tensor]:
        return [p for g in self.sparse.param_groups for p in g["params"]] if self.sparse else []

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        # Opting out of sparse invariant checks explicitly, for the step: the tensors are built coalesced
        # here, and torch's own sparse Adagrad would otherwise warn "implicitly disabled" into every run.
        with torch.sparse.check_sparse_tensor_invariants(enable=False):
            self._step()

    def _step(self) -> None:
        if self.sparse is not None:
            for p in self.embedding_params:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:  # once, here: the optimizers' own coalesce() is then a no-op
                    p.grad = coalesce_rows(p.grad)
                if p.grad.is_sparse or not isinstance(self.sparse, LazyAdam):
                    add_touched_row_l2_(p, self.embedding_l2)
                if self._needs_sparse_grad and not p.grad.is_sparse:
                    p.grad = _row_sparse(p.grad)
        for o in self.optimizers:
            o.step()

    def state_dict(self) -> dict[str, Any]:
        return {
            "dense": self.dense.state_dict() if self.dense else None,
            "sparse": self.sparse.state_dict() if self.sparse else None,
            "wide": self.wide.state_dict() if self.wide else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, opt in (("dense", self.dense), ("sparse", self.sparse), ("wide", self.wide)):
            if (opt is None) != (state.get(name) is None):
                raise ValueError(
                    f"optimizer state has {'no ' if state.get(name) is None else ''}{name} part but the "
                    f"model has {'no ' if opt is None else ''}{name} parameters"
                )
            if opt is not None:
                opt.load_state_dict(state[name])


def _kernel(params: list[nn.Parameter]) -> dict[str, bool]:
    """torch's fused optimizer kernel where it has one for these parameters (float tensors on CPU or CUDA),
    else the multi-tensor one: one pass over all parameters instead of a Python loop of small ops."""
    fusable = all(p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.float64, torch.bfloat16,
                                                                   torch.float16) for p in params)
    return {"fused": True} if fusable else {"foreach": True}


def build_dense_optimizer(
    name: str, params: list[nn.Parameter], lr: float, weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    kernel = _kernel(params)  # Adam / AdamW only: SGD and Adagrad also take sparse gradients, which neither kernel does
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, **kernel)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **kernel)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, weight_decay=weight_decay)
    raise ConfigError(f"train.dense_optimizer {name!r} is not one of {DENSE_OPTIMIZERS}")


def build_sparse_optimizer(name: str, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr)
    if name == "rowwise_adagrad":
        return RowWiseAdagrad(params, lr=lr)
    if name == "sparse_adam":
        return LazyAdam(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise ConfigError(f"train.sparse_optimizer {name!r} is not one of {SPARSE_OPTIMIZERS}")


def build_optimizers(model: CTRModel, config: Any) -> OptimizerSet:
    """An :class:`OptimizerSet` for ``model`` from a :class:`~ctrkit.training.config.TrainConfig`
    (fields dense_optimizer, sparse_optimizer, lr, embedding_lr, weight_decay, embedding_l2,
    wide_optimizer and ftrl_*)."""
    if not isinstance(model, CTRModel):
        raise ConfigError(f"build_optimizers needs a ctrkit CTRModel (its declared embedding tables and "
                          f"parameter groups); got {type(model).__name__}")
    dense, emb = split_parameters(model)
    if not dense and not emb:
        raise ConfigError("the model has no trainable parameters")
    wide_opt = None
    if config.wide_optimizer == "ftrl":
        groups = [g for g in model.param_groups() if g.optimizer == "ftrl"]
        if not groups:
            raise ConfigError(
                f"train.wide_optimizer=ftrl needs a model with a wide part (a parameter group declared with "
                f"optimizer='ftrl'); {model.model_name or type(model).__name__!r} declares none; "
                "set train.wide_optimizer=default"
            )
        from ctrkit.training.ftrl import FTRL

        wide = {id(p): p for g in groups for p in g.params if p.requires_grad}
        dense = [p for p in dense if id(p) not in wide]
        emb = [p for p in emb if id(p) not in wide]
        wide_opt = FTRL(list(wide.values()), alpha=config.ftrl_alpha, beta=config.ftrl_beta, l1=config.ftrl_l1,
                        l2=config.ftrl_l2)
    emb_lr = config.embedding_lr if config.embedding_lr is not None else config.lr
    return OptimizerSet(
        build_dense_optimizer(config.dense_optimizer, dense, config.lr, config.weight_decay) if dense else None,
        build_sparse_optimizer(config.sparse_optimizer, emb, emb_lr) if emb else None,
        embedding_l2=config.embedding_l2,
        wide=wide_opt,
    )
