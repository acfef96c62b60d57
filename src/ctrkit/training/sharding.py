"""Sharded embedding tables: a model built with ``embedding_backend: torchrec`` wrapped by torchrec's
``DistributedModelParallel`` (DESIGN §8, issue 26 item 3).

- The plan: torchrec's planner, each table restricted to the sharding types the device offers. torchrec's
  EmbeddingBagCollection sharder offers data_parallel, table_wise, column_wise and table_column_wise on CPU and adds
  row_wise on CUDA (its row-wise sharder lists row_wise for CUDA / TPU devices only); its EmbeddingCollection sharder
  (histories) has no table_column_wise, and its data_parallel returns one row per bag in torchrec 1.9.2, so
  history tables are never data_parallel. ``sharding: auto`` lets the planner choose among the allowed types
  per table; a named type is the only one allowed.
- The fused optimizers: the tables' optimizer runs inside the backward of the fbgemm kernels
  (``apply_optimizer_in_backward``): ``rowwise_adagrad`` (fbgemm EXACT_ROWWISE_ADAGRAD), ``adagrad`` (EXACT_ADAGRAD),
  ``sgd`` (EXACT_SGD) at ``train.embedding_lr``. Other sparse optimizers are a ConfigError.
- Tables the planner puts on data_parallel are plain replicated weights inside DDP: torchrec's fused optimizer
  does not step them (the known pitfall), so :meth:`ShardedModel.optimizers` gives them the same optimizer as the
  fused tables (ctrkit's own implementation of it, on their all-reduced gradients), beside the dense optimizer.
- Tables whose width is not a multiple of 4 (first-order weights of dim 1, ...) are always data_parallel: fbgemm's
  fused kernels take widths in multiples of 4 only.
- The dense part is data parallel (DDP inside DistributedModelParallel).
- Initial weights. A model built within :func:`ctrkit.nn.embedding_torchrec.meta_tables` (as the train job builds
  it on several processes) has its tables on the meta device: no rank ever holds a whole table. DistributedModelParallel
  allocates each rank's shards; :func:`shard` fills them from the tables' :class:`~ctrkit.nn.table_init.TableInit`
  (blocks of rows drawn from (seed, table)), each rank only the rows and columns of its own shards, one block of
  memory at a time -- the same values a one-process build of the same seed holds, whatever the world size and the
  plan. A model built with its tables allocated (weights loaded into it, say) has its shards copied from those
  weights instead. DistributedModelParallel's own initialisation of the shards is overwritten either way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ctrkit.errors import ConfigError
from ctrkit.nn.table_init import TableInit
from ctrkit.nn.table_memory import check_tables_fit
from ctrkit.training.optim import OptimizerSet, RowWiseAdagrad, build_dense_optimizer

log = logging.getLogger(__name__)

CPU_SHARDING = ("table_wise", "column_wise", "table_column_wise", "data_parallel")
CUDA_SHARDING = (*CPU_SHARDING, "row_wise")
SHARDING = ("auto", *CUDA_SHARDING)
FUSED_SPARSE_OPTIMIZERS = ("rowwise_adagrad", "adagrad", "sgd")
# not for torchrec's EmbeddingCollection (histories): its sharder has no table_column_wise, and its data_parallel
# lookup returns one row per bag instead of per id in torchrec 1.9.2 (measured)
_BAG_ONLY = {"table_column_wise", "data_parallel"}


def allowed_sharding(sharding: str, device: torch.device) -> list[str]:
    """The sharding types a table may get on ``device`` for ``train.distributed.sharding`` = ``sharding``."""
    offered = CUDA_SHARDING if device.type == "cuda" else CPU_SHARDING
    if sharding == "auto":
        return list(offered)
    if sharding not in SHARDING:
        raise ConfigError(f"train.distributed.sharding: {sharding!r} is not one of {SHARDING}")
    if sharding not in offered:
        raise ConfigError(
            f"train.distributed.sharding: {sharding!r} needs CUDA devices: torchrec shards tables row-wise only on "
            f"CUDA (its CPU sharders offer {', '.join(CPU_SHARDING)}); choose one of those or auto, or train on GPUs")
    return [sharding]


def fused_optimizer(name: str, lr: float) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The optimizer class and arguments ``apply_optimizer_in_backward`` maps to an fbgemm fused kernel."""
    import torchrec.optim as trec_optim

    if name == "rowwise_adagrad":
        return trec_optim.RowWiseAdagrad, {"lr": lr, "eps": 1e-8}
    if name == "adagrad":
        return torch.optim.Adagrad, {"lr": lr, "eps": 1e-10}
    if name == "sgd":
        return torch.optim.SGD, {"lr": lr}
    raise ConfigError(f"train.sparse_optimizer: {name!r} has no fused kernel for the torchrec embedding backend; "
                      f"choose one of {', '.join(FUSED_SPARSE_OPTIMIZERS)}, or use model.params.embedding_backend=fused")


def _replica_optimizer(name: str, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The optimizer of the replicated (data_parallel) tables: the fused kernel's update, in ctrkit / torch."""
    if name == "rowwise_adagrad":
        return RowWiseAdagrad(params, lr=lr, eps=1e-8)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, eps=1e-10)
    return torch.optim.SGD(params, lr=lr)


def _torchrec_modules(module: nn.Module) -> dict[str, list[tuple[str, bool, int]]]:
    """Module path -> [(table, is EmbeddingCollection, dim)] of every torchrec embedding module in ``module``."""
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    out: dict[str, list[tuple[str, bool, int]]] = {}
    for path, m in module.named_modules():
        if isinstance(m, EmbeddingBagCollection):
            out[path] = [(c.name, False, c.embedding_dim) for c in m.embedding_bag_configs()]
        elif isinstance(m, EmbeddingCollection):
            out[path] = [(c.name, True, c.embedding_dim) for c in m.embedding_configs()]
    return out


def _constraints(module: nn.Module, types: list[str]) -> dict[str, Any]:
    """Per table: the sharding types allowed. Column shards keep torchrec's default width (a table up to 128 columns
    stays one shard, so column_wise then places it as table_wise does); narrower shards would also change
    rowwise_adagrad, whose per-row step size torchrec computes over each column shard on its own."""
    from torchrec.distributed.planner.types import ParameterConstraints

    out, narrow = {}, []
    for path, tables in _torchrec_modules(module).items():
        for table, unpooled, dim in tables:
            if dim % 4:  # fbgemm's fused kernels take widths in multiples of 4: such a table is replicated
                narrow.append(f"{path}.{table}")
                out[table] = ParameterConstraints(sharding_types=["data_parallel"])
                continue
            allowed = [t for t in types if not (unpooled and t in _BAG_ONLY)]
            if not allowed:
                raise ConfigError(
                    f"train.distributed.sharding: table {table!r} ({path}) holds a history, which torchrec shards with its "
                    f"EmbeddingCollection sharder; it cannot be {types[0]} (module docstring): choose table_wise, "
                    "column_wise or auto")
            out[table] = ParameterConstraints(sharding_types=allowed)
    if not out:
        raise ConfigError("the model has no torchrec embedding tables to shard; build it with "
                          "model.params.embedding_backend=torchrec")
    if narrow:
        log.info("tables of a width not a multiple of 4 are replicated (data_parallel; fbgemm's fused kernels need "
                 "multiples of 4): %s", narrow)
    return out


@dataclass
class ShardedModel:
    """A module whose torchrec tables are sharded: ``module`` (DistributedModelParallel), the ``plan``, the parameter
    names of the replicated (``data_parallel``) tables and the sparse optimizer's name and learning rate."""

    module: nn.Module
    plan: Any
    replicated: list[str]
    sparse_optimizer: str
    embedding_lr: float

    def sharding_types(self) -> dict[str, str]:
        """``<module path>.<table>`` -> the sharding type the planner gave it."""
        from ctrkit.nn.embedding_torchrec import ctrkit_name

        return {f"{path}.{ctrkit_name(t)}": ps.sharding_type for path, m in self.plan.plan.items() for t, ps in m.items()}

    def optimizers(self, dense_optimizer: str, lr: float, weight_decay: float = 0.0) -> OptimizerSet:
        """What the trainer steps: the dense optimizer, and the replicated tables' optimizer as the sparse one
        (the sharded tables are stepped in backward, never here)."""
        dense, replicated = [], []
        for name, p in self.module.named_parameters():
            if not p.requires_grad or hasattr(p, "_in_backward_optimizers"):
                continue
            (replicated if name in self.replicated else dense).append(p)
        return OptimizerSet(
            build_dense_optimizer(dense_optimizer, dense, lr, weight_decay) if dense else None,
            _replica_optimizer(self.sparse_optimizer, replicated, self.embedding_lr) if replicated else None,
        )


def shard(module: nn.Module, *, sharding: str = "auto", sparse_optimizer: str = "adagrad",
                embedding_lr: float = 1e-3, device: torch.device | str = "cpu",
                process_group: Any = None) -> ShardedModel:
    """``module`` (holding a model built with ``embedding_backend: torchrec``) wrapped by DistributedModelParallel on
    the default process group: a plan limited to ``sharding`` on ``device`` (:func:`allowed_sharding`), the tables'
    ``sparse_optimizer`` fused in backward, the dense part data parallel (module docstring)."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    if not dist.is_initialized():
        raise ConfigError("sharding tables needs torch.distributed initialised (launch with torchrun, or "
                          "ctrkit train --nproc-per-node N)")
    device = torch.device(device)
    pg = process_group or dist.GroupMember.WORLD
    constraints = _constraints(module, allowed_sharding(sharding, device))
    opt_cls, opt_args = fused_optimizer(sparse_optimizer, embedding_lr)
    full = module.state_dict()  # the unsharded weights (ctrkit's names; meta tensors for meta tables)
    inits = table_inits(module)  # how each table's values are made, for the tables on the meta device
    modules = _torchrec_modules(module)
    tables = [p for path in modules for p in module.get_submodule(path).parameters()]
    apply_optimizer_in_backward(opt_cls, tables, opt_args)
    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    topology = Topology(world_size=dist.get_world_size(pg), compute_device=device.type)
    plan = EmbeddingShardingPlanner(topology=topology, constraints=constraints).collective_plan(module, sharders, pg)
    check_shards_fit(module, plan, dist.get_rank(pg))
    dmp = DistributedModelParallel(module, env=None, device=device, plan=plan, sharders=sharders)
    copy_weights(dmp.state_dict(), full, inits)
    unpooled = {(path, t): u for path, ts in modules.items() for t, u, _ in ts}
    replicated = [f"{path}.{'embeddings' if unpooled[path, t] else 'embedding_bags'}.{t}.weight"
                  for path, m in plan.plan.items() for t, ps in m.items() if ps.sharding_type == "data_parallel"]
    log.info("sharded tables: %s", {t: ps.sharding_type for m in plan.plan.values() for t, ps in m.items()})
    return ShardedModel(dmp, plan, replicated, sparse_optimizer, embedding_lr)


def table_inits(module: nn.Module) -> dict[str, TableInit]:
    """State-dict name (``<path>.tables.<table>``) -> :class:`TableInit` of every torchrec-backend table in
    ``module``."""
    from ctrkit.nn.embedding_torchrec import TorchrecEmbeddingCollection

    return {f"{path}.tables.{t}" if path else f"tables.{t}": init for path, m in module.named_modules()
            if isinstance(m, TorchrecEmbeddingCollection) for t, init in m.table_inits().items()}


def check_shards_fit(module: nn.Module, plan: Any, rank: int) -> None:
    """A LayerConfigError (:func:`~ctrkit.nn.table_memory.check_tables_fit`) when the shards ``plan`` puts on
    ``rank`` (replicated tables whole) of ``module``'s torchrec tables do not fit in the memory this process can
    get: a model built on the meta device is checked here, shard by shard, instead of whole when it is built."""
    shards = []
    for path, m in plan.plan.items():
        for t, ps in m.items():
            if ps.sharding_spec is None:  # data_parallel: the whole table on every rank
                w = module.get_submodule(path).state_dict(keep_vars=True)
                weight = next(v for k, v in w.items() if k.endswith(f".{t}.weight"))
                shards.append(_Part(f"{t} (replicated)", *weight.shape))
                continue
            shards += [_Part(f"{t} rows {s.shard_offsets[0]}+ columns {s.shard_offsets[1]}+", *s.shard_sizes)
                       for s in ps.sharding_spec.shards if s.placement.rank() == rank]
    check_tables_fit(shards)


@dataclass(frozen=True)
class _Part:
    """A shard as :func:`~ctrkit.nn.table_memory.check_tables_fit` reads a table."""

    name: str
    num_embeddings: int
    embedding_dim: int


@torch.no_grad()
def copy_weights(target: Mapping[str, Any], full: Mapping[str, torch.Tensor],
                 inits: Mapping[str, TableInit] | None = None) -> None:
    """Fill ``target`` (a sharded state dict: ShardedTensor, DTensor or plain tensors, in place) from full tensors of
    the same names, each rank the slices of its own shards; a full tensor on the meta device (a table never
    allocated) by its ``inits`` entry instead, block by block (module docstring)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    inits = inits or {}
    for key, value in target.items():
        src = full[key]
        if src.is_meta and key not in inits:
            raise ConfigError(f"{key} is on the meta device and is not a torchrec-backend table: only tables may be "
                              "built on meta (ctrkit.nn.embedding_torchrec.meta_tables)")
        init = inits[key] if src.is_meta else None
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                r0, c0 = shard.metadata.shard_offsets
                r, c = shard.metadata.shard_sizes
                if init is not None:
                    init.fill(shard.tensor, r0, c0)
                else:
                    shard.tensor.copy_(src[r0: r0 + r, c0: c0 + c])
        elif hasattr(value, "to_local") and hasattr(value, "placements"):  # DTensor
            raise ConfigError(f"{key}: a DTensor shard layout is not handled by ctrkit's weight copy yet")
        elif isinstance(value, torch.Tensor):
            if init is not None:
                init.fill(value)
            else:
                value.copy_(src)


# ---- the trainer's side (training/distributed.py's hook, the Trainer's optimizer set, writer and evaluation) ----
def uses_torchrec(model: nn.Module) -> bool:
    """Whether ``model`` holds tables of the torchrec embedding backend."""
    from ctrkit.nn.embedding_torchrec import TorchrecEmbeddingCollection

    return any(isinstance(m, TorchrecEmbeddingCollection) for m in model.modules())


def shard_model(step: nn.Module, ctx: Any, config: Any) -> nn.Module:
    """The training module of a run on several processes whose model uses the torchrec backend: ``step`` (the
    trainer's TaskStep) sharded by :func:`shard` with ``config`` (a TrainConfig: ``distributed.sharding``,
    ``sparse_optimizer``, ``embedding_lr``) on ``ctx.device``. The :class:`ShardedModel` rides along as
    ``module.ctrkit_sharded`` (:func:`sharded_of`)."""
    if config.embedding_l2:
        raise ConfigError("train.embedding_l2 is not applied by the fused optimizers of the torchrec embedding "
                          "backend; set train.embedding_l2=0, or use model.params.embedding_backend=fused")
    if config.wide_optimizer != "default":
        raise ConfigError(f"train.wide_optimizer={config.wide_optimizer} trains tables outside the fused optimizers "
                          "of the torchrec embedding backend; set train.wide_optimizer=default")
    lr = config.embedding_lr if config.embedding_lr is not None else config.lr
    sm = shard(step, sharding=config.distributed.sharding, sparse_optimizer=config.sparse_optimizer,
               embedding_lr=lr, device=ctx.device)
    sm.module.ctrkit_sharded = sm
    return sm.module


def sharded_of(module: nn.Module) -> ShardedModel | None:
    """The :class:`ShardedModel` of a module :func:`shard_model` returned, else None."""
    return getattr(module, "ctrkit_sharded", None)


def sharded_optimizers(module: nn.Module, config: Any) -> OptimizerSet | None:
    """The trainer's optimizer set of a sharded training module (dense parameters and replicated tables; the
    sharded tables are stepped in backward), else None."""
    sm = sharded_of(module)
    return sm.optimizers(config.dense_optimizer, config.lr, config.weight_decay) if sm is not None else None


def even_forwards(module: nn.Module, batches: Iterator[Any], loader: Any, model: nn.Module) -> Iterator[Any]:
    """``batches`` (of ``loader``); when ``module`` is a sharded training module, followed by as many extra forwards
    of ``model`` on the last batch (results dropped) as the rank with the most batches makes: a sharded model's
    forward is collective (its ranks exchange embeddings), so every rank must call it equally often."""
    return _padded(batches, len(loader), model) if sharded_of(module) is not None else batches


def _padded(batches: Iterator[Any], n: int, model: nn.Module) -> Iterator[Any]:
    """The rank's batches, then its padding forwards; a rank without any batch (fewer batches than ranks) pads with
    rank 0's first batch (batch 0 of a round-robin share is rank 0's), broadcast to it."""
    counts = torch.tensor([n, int(n == 0)])
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    most, someone_empty = int(counts[0]), bool(counts[1]) and int(counts[0]) > 0
    first = next(batches, None)
    pad = [first if dist.get_rank() == 0 else None]
    if someone_empty:
        dist.broadcast_object_list(pad, src=0)
    last = first
    if first is not None:
        yield first
        for last in batches:
            yield last
    with torch.no_grad():
        for _ in range(most - n):
            model(last if last is not None else pad[0])


def sharded_writer(writer: Any, module: nn.Module) -> Any:
    """The trainer's checkpoint writer: ``writer``, or its sharded twin
    (:class:`~ctrkit.training.sharded_checkpoint.ShardedCheckpointWriter`) when ``module`` is a sharded training
    module."""
    from ctrkit.training.sharded_checkpoint import ShardedCheckpointWriter

    sm = sharded_of(module)
    return ShardedCheckpointWriter(writer, module, sm.plan) if sm is not None else writer
