"""The ``torchrec`` embedding backend: the tables of :class:`~ctrkit.nn.embedding_interface.EmbeddingCollection` held
by torchrec modules, so that :class:`torchrec.distributed.DistributedModelParallel` can shard them
(:mod:`ctrkit.training.sharding`). Needs the optional extra ``ctrkit[distributed]`` (torchrec, fbgemm-gpu-cpu).

Where a table lives (each table in exactly one torchrec module, since torchrec modules own their weights):

- most tables -> ``ebc``, a torchrec ``EmbeddingBagCollection`` summing bags in the kernel (sharded, a rank receives
  B x D values per feature, not one vector per id); a "mean" feature is that sum divided by its bag's length (0 for
  an empty bag), as the fused backend's ``embedding_bag``;
- a table read by an unpooled sequence whose width is a multiple of 4 -> ``ecs["d<D>"]``, a torchrec
  ``EmbeddingCollection`` per dim (torchrec asks one dim per EmbeddingCollection), whose pooled features are summed
  / averaged here from the unpooled rows. Narrower tables stay in ``ebc``: fbgemm's fused kernels need widths in
  multiples of 4, so such a table is replicated when sharded, and torchrec 1.9.2's data-parallel
  EmbeddingCollection returns one row per bag instead of per id (measured), while its EmbeddingBagCollection does not.

``sequence`` and ``lookup`` read rows of a table: an ``ecs`` table through its extra feature ``<table>@lookup``, an
``ebc`` table through single-id bags of its first feature (a sum over one id is the row). A sharded torchrec module
fixes its feature order at its first call, so every call passes all of its features, in one order (empty bags for
the features a call does not read).

The state dict names tables as the fused backend does, ``<prefix>tables.<table>`` -> ``[rows, D]`` (a
``ShardedTensor`` once sharded), so a checkpoint of either backend loads into the other.

Initial values: each table's come from :class:`~ctrkit.nn.table_init.TableInit` -- blocks of rows drawn from
(``table_seed``, table name), ``table_seed`` being one draw of the global RNG when the collection is built -- never
from the global RNG row by row. Within :func:`meta_tables` the torchrec modules are built on the meta device
(nothing allocated; a run on several processes builds its model so, and DistributedModelParallel allocates each
rank's shards, which :func:`ctrkit.training.sharding.shard` fills from the same blocks); outside it they are
allocated here and filled whole. Either way the tables hold the same values, and the rest of the model draws the
same numbers from the global RNG (building on meta draws nothing, and the allocation's own draws are undone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn

from ctrkit.batch import KeyedJagged
from ctrkit.errors import IdOutOfRangeError, LayerConfigError, UnknownKeyError
from ctrkit.nn.embedding_interface import EmbeddingCollection, PooledEmbeddings, PoolGroup
from ctrkit.nn.table_init import TableInit
from ctrkit.nn.table_memory import check_tables_fit
from ctrkit.schema import TableSpec

__all__ = ["TorchrecEmbeddingCollection", "ctrkit_name", "meta_tables", "torchrec_available"]

_ON_META: ContextVar[bool] = ContextVar("ctrkit_torchrec_tables_on_meta", default=False)


@contextmanager
def meta_tables(on: bool = True) -> Iterator[None]:
    """Within the block (``on``), :class:`TorchrecEmbeddingCollection` builds its tables on the meta device: no
    memory, no values, until DistributedModelParallel allocates the shards (module docstring)."""
    token = _ON_META.set(bool(on))
    try:
        yield
    finally:
        _ON_META.reset(token)

INSTALL_HINT = ("install the optional extra: pip install --no-deps torchrec==1.9.2 fbgemm-gpu-cpu==1.8.0 and "
                "pip install 'ctrkit[distributed]' (see the Makefile's install step)")


def torchrec_available() -> bool:
    """Whether torchrec (and its fbgemm kernels) import in this environment."""
    try:
        import torchrec  # noqa: F401
    except (ImportError, OSError, RuntimeError):  # missing, or an fbgemm build that does not load here
        return False
    return True


def _torchrec() -> Any:
    try:
        import torchrec
    except (ImportError, OSError, RuntimeError) as e:
        raise LayerConfigError(f"embedding backend 'torchrec' needs torchrec, which does not import here ({e}); "
                               f"{INSTALL_HINT}") from None
    return torchrec


def _lookup_key(table: str) -> str:
    return f"{table}@lookup"


class TorchrecEmbeddingCollection(EmbeddingCollection):
    """The ``torchrec`` backend (module docstring). Arguments as :class:`~ctrkit.nn.embedding.EmbeddingBagCollection`'s
    (``sparse_grad`` is torchrec's business: unsharded tables get dense gradients, sharded ones fused updates)."""

    def __init__(self, tables: Sequence[TableSpec], feature_to_table: Mapping[str, str] | None = None,
                 feature_pooling: Mapping[str, str] | None = None, *,
                 sequence_keys: Mapping[str, tuple[str, int]] | None = None, validate: bool = True,
                 init: str = "uniform", std: float | None = None) -> None:
        from ctrkit.nn.embedding import _check_features, _checked_init, _table_map

        super().__init__()
        trec = _torchrec()
        self.init, self.std = _checked_init(init, std)
        self.tables: dict[str, TableSpec] = _table_map(tables)
        if feature_to_table is None:
            feature_to_table = {f: t.name for t in tables for f in t.features}
        feature_pooling, sequence_keys = dict(feature_pooling or {}), dict(sequence_keys or {})
        _check_features(self.tables, feature_to_table, feature_pooling, sequence_keys)
        self.keys: list[str] = list(feature_to_table)
        self.feature_to_table: dict[str, str] = dict(feature_to_table)
        self.feature_pooling: dict[str, str] = {k: feature_pooling.get(k, "sum") for k in self.keys}
        for k, p in self.feature_pooling.items():
            if p not in ("sum", "mean"):
                raise LayerConfigError(f"feature {k!r}: pooling {p!r} is not one of ('sum', 'mean')")
        self.sequence_keys: dict[str, tuple[str, int]] = {k: (t, int(n)) for k, (t, n) in sequence_keys.items()}
        self.validate = bool(validate)
        self.dims: list[int] = [self.tables[self.feature_to_table[k]].embedding_dim for k in self.keys]
        # the tables' initial values: blocks drawn from this seed (module docstring); one global draw either way
        self.table_seed = int(torch.randint(0, 2**62, (1,)).item())
        self.on_meta = _ON_META.get()  # tables on the meta device: sharding allocates them (training/sharding.py)
        if not self.on_meta:
            check_tables_fit(list(self.tables.values()))
        self._place_tables()
        self._build(trec)
        self._register_state_dict_hook(_rename_saved)
        self._register_load_state_dict_pre_hook(_rename_loaded, with_module=True)

    def _place_tables(self) -> None:
        """``_bag_tables`` (-> ebc) and ``_seq_tables`` (-> ecs), in table order (module docstring)."""
        unpooled = {t for t, _ in self.sequence_keys.values() if self.tables[t].embedding_dim % 4 == 0}
        self._seq_tables = [n for n in self.tables if n in unpooled]
        self._bag_tables = [n for n in self.tables if n not in unpooled]
        self._bag_keys = [k for k in self.keys if self.feature_to_table[k] in self._bag_tables]
        # the EmbeddingBagCollection's features: the pooled ones, and a lookup feature for a table without any
        self._feat_table = {k: self.feature_to_table[k] for k in self._bag_keys}
        self._feat_table.update({_lookup_key(n): n for n in self._bag_tables if n not in self._feat_table.values()})
        self._ebc_feats = list(self._feat_table)
        # the features of each dim's EmbeddingCollection, in one fixed order
        self._ec_keys: dict[int, list[str]] = {}
        self._ec_table: dict[str, str] = {}  # EmbeddingCollection feature -> table
        for name in self._seq_tables:
            feats = [k for k in self.keys if self.feature_to_table[k] == name] + [_lookup_key(name)]
            self._ec_keys.setdefault(self.tables[name].embedding_dim, []).extend(feats)
            self._ec_table.update({f: name for f in feats})

    def table_inits(self) -> dict[str, TableInit]:
        """table -> how its initial values are made (:class:`~ctrkit.nn.table_init.TableInit`)."""
        return {n: TableInit(self.table_seed, n, t.num_embeddings, t.embedding_dim, self.init, self.std)
                for n, t in self.tables.items()}

    def _build(self, trec: Any) -> None:
        """The torchrec modules, on the meta device within :func:`meta_tables`, else allocated and filled by
        :meth:`table_inits` (torchrec calls each table's ``init_fn``); the global RNG is left as it was."""
        inits = self.table_inits()
        device = torch.device("meta") if self.on_meta else None
        with torch.random.fork_rng(devices=[]):  # nn.EmbeddingBag's own normal_ init, overwritten by init_fn
            self._build_modules(trec, device, lambda name: _filler(inits[name], self.on_meta))

    def _build_modules(self, trec: Any, device: torch.device | None, init_fn: Callable[[str], Any]) -> None:
        bags = []
        for name in self._bag_tables:
            t = self.tables[name]
            feats = [k for k in self._ebc_feats if self._feat_table[k] == name]
            bags.append(trec.EmbeddingBagConfig(name=self.torchrec_name(name), num_embeddings=t.num_embeddings,
                                                embedding_dim=t.embedding_dim, feature_names=feats,
                                                pooling=trec.PoolingType.SUM, init_fn=init_fn(name)))
        self.ebc = trec.EmbeddingBagCollection(tables=bags, device=device) if bags else None
        ecs = {}
        for d, keys in self._ec_keys.items():
            cfgs = [trec.EmbeddingConfig(name=self.torchrec_name(n), num_embeddings=self.tables[n].num_embeddings,
                                         embedding_dim=d, feature_names=[k for k in keys if self._ec_table[k] == n],
                                         init_fn=init_fn(n))
                    for n in self._seq_tables if self.tables[n].embedding_dim == d]
            ecs[f"d{d}"] = trec.EmbeddingCollection(tables=cfgs, device=device)
        self.ecs = nn.ModuleDict(ecs)

    def torchrec_name(self, table: str) -> str:
        """The table's name inside torchrec: ``<table>#<b|s><dim>`` (b: EmbeddingBagCollection, s: EmbeddingCollection).
        torchrec's planner takes constraints by table name; tables of one name in two collections (a model's
        first-order weights and its embeddings) get different constraints only when their dim or module differs."""
        kind = "s" if table in self._seq_tables else "b"
        return f"{table}#{kind}{self.tables[table].embedding_dim}"

    # ---- parameters ----------------------------------------------------------------------------
    def reset_parameters(self) -> None:
        """Every table back to its initial values (:meth:`table_inits`: ``init`` as the fused backend's, uniform
        bound sqrt(1/rows)); tables on the meta device stay there."""
        inits = self.table_inits()
        for name, w in self.table_weights().items():
            if not w.is_meta:
                inits[name].fill(w)

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> TorchrecEmbeddingCollection:
        """``.to()`` / ``.cuda()`` / ``.float()`` ... leave tables on the meta device there (DistributedModelParallel
        allocates their shards on its device); every other tensor as nn.Module does."""
        return super()._apply(lambda t: t if t.is_meta else fn(t), recurse)

    def table_weights(self) -> dict[str, torch.Tensor]:
        """table -> its weight ``[rows, D]`` (unsharded modules only)."""
        out: dict[str, torch.Tensor] = {}
        if self.ebc is not None:
            out.update({ctrkit_name(n): m.weight for n, m in self.ebc.embedding_bags.items()})
        for ec in self.ecs.values():
            out.update({ctrkit_name(n): m.weight for n, m in ec.embeddings.items()})
        return out

    def table_weight(self, table: str) -> torch.Tensor:
        return self.table_weights()[table]

    def table_rows(self) -> list[tuple[nn.Parameter, dict[str, int]]]:
        return [(w, {n: 0}) for n, w in self.table_weights().items()]  # type: ignore[misc]

    def embedding_parameters(self) -> Iterator[nn.Parameter]:
        if self.ebc is not None:
            yield from self.ebc.parameters()
        for ec in self.ecs.values():
            yield from ec.parameters()

    # ---- forward -------------------------------------------------------------------------------
    def _kjt(self, keys: Sequence[str], per_key: Mapping[str, tuple[torch.Tensor, torch.Tensor]], B: int) -> Any:
        """torchrec's KeyedJaggedTensor of ``keys`` (all of a module's features, in its order): the (values,
        lengths (B,)) of the keys in ``per_key``, empty bags for the others."""
        from torchrec import KeyedJaggedTensor

        ref = next(iter(per_key.values()))[0]
        empty_v, empty_l = ref.new_zeros(0), ref.new_zeros(B)
        vals = [per_key[k][0] if k in per_key else empty_v for k in keys]
        lens = [per_key[k][1] if k in per_key else empty_l for k in keys]
        return KeyedJaggedTensor(keys=list(keys), values=torch.cat(vals), lengths=torch.cat(lens), stride=B)

    def _checked(self, key: str, table: str, values: torch.Tensor) -> torch.Tensor:
        if self.validate and values.numel() and not torch.compiler.is_exporting():
            lo, hi = torch.aminmax(values)
            n = self.tables[table].num_embeddings
            if int(lo) < 0 or int(hi) >= n:
                bad = int(lo) if int(lo) < 0 else int(hi)
                raise IdOutOfRangeError(f"feature {key!r}: id {bad} is outside table {table!r} of size {n} (valid "
                                        f"ids 0..{n - 1}); check the vocab_size in the schema or the preprocessing")
        return values

    def pooled(self, kj: KeyedJagged) -> PooledEmbeddings:
        if kj.weights is not None:
            raise LayerConfigError("embedding backend 'torchrec' does not take per-sample weights yet; train this "
                                   "data with model.params.embedding_backend=fused")
        B, out = kj.stride, {}
        parts = {k: kj[k][:2] for k in self.keys if k in kj.keys}
        missing = [k for k in self.keys if k not in parts]
        if missing:
            raise UnknownKeyError(f"sparse input lacks features {missing}; it has {kj.keys}")
        for k, (v, _) in parts.items():
            self._checked(k, self.feature_to_table[k], v)
        if self._bag_keys:
            sums = self.ebc(self._kjt(self._ebc_feats, {k: parts[k] for k in self._bag_keys}, B)).to_dict()
            out.update({k: _mean(sums[k], parts[k][1]) if self.feature_pooling[k] == "mean" else sums[k]
                        for k in self._bag_keys})
        for d, keys in self._ec_keys.items():
            pooled = [k for k in keys if k in self.feature_pooling]
            if pooled:
                jts = self.ecs[f"d{d}"](self._kjt(keys, {k: parts[k] for k in pooled}, B))
                out.update({k: _pool(jts[k].values(), parts[k][1], self.feature_pooling[k]) for k in pooled})
        return self._assemble(out)

    def _assemble(self, out: Mapping[str, torch.Tensor]) -> PooledEmbeddings:
        """One ``[F_g, B, D]`` tensor per dim, features in key order."""
        groups, tensors = [], []
        for d in dict.fromkeys(self.dims):
            pos = tuple(i for i, k in enumerate(self.keys) if self.dims[i] == d)
            keys = tuple(self.keys[i] for i in pos)
            groups.append(PoolGroup(d, "mixed", keys, pos))
            tensors.append(torch.stack([out[k] for k in keys]))  # (F_g, B, D)
        return PooledEmbeddings(self.keys, self.dims, groups, tensors)

    def sequence(self, kj: KeyedJagged, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        if key not in self.sequence_keys:
            raise UnknownKeyError(f"no unpooled sequence feature {key!r}; known: {sorted(self.sequence_keys)}")
        table, max_len = self.sequence_keys[key]
        ids, mask = kj.to_padded(key, max_len)  # (B, T) each, the last max_len ids of each row
        rows = self._rows(table, self._checked(key, table, ids[mask]))  # (n, D) row by row, oldest first
        emb = rows.new_zeros(*mask.shape, rows.shape[1])  # (B, T, D); pads are zero and get no gradient
        emb[mask] = rows
        return emb, mask

    def lookup(self, table: str, ids: torch.Tensor, *, key: str | None = None) -> torch.Tensor:
        """Rows of ``table`` for ``ids`` -> ``(*ids.shape, D)``; ``key`` names the feature in errors."""
        if table not in self.tables:
            raise UnknownKeyError(f"no table {table!r}; tables: {list(self.tables)}")
        rows = self._rows(table, self._checked(key or f"{table} lookup", table, ids.reshape(-1)))
        return rows.reshape(*ids.shape, self.tables[table].embedding_dim)

    def _rows(self, table: str, ids: torch.Tensor) -> torch.Tensor:
        """Rows (n, D) of ``table`` for ids (n,), through the module that holds it (module docstring)."""
        t, n, ones = self.tables[table], ids.numel(), torch.ones_like(ids)
        if t.name in self._seq_tables:
            feat = _lookup_key(t.name)
            return self.ecs[f"d{t.embedding_dim}"](self._kjt(self._ec_keys[t.embedding_dim], {feat: (ids, ones)},
                                                             n))[feat].values()
        feat = next(k for k in self._ebc_feats if self._feat_table[k] == t.name)
        return self.ebc(self._kjt(self._ebc_feats, {feat: (ids, ones)}, n)).to_dict()[feat]

    def extra_repr(self) -> str:
        ts = ", ".join(f"{t.name}({t.num_embeddings}x{t.embedding_dim})" for t in self.tables.values())
        return f"keys={self.keys}, tables=[{ts}], init={self.init}, bag_tables={self._bag_tables}"


def _filler(init: TableInit, on_meta: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """torchrec's ``init_fn`` of a table: the whole weight from :class:`TableInit`. torchrec's sharded modules call it
    too, on each rank's local shard (a slice whose offsets it does not pass) or on an empty placeholder: only a
    weight of the whole table's shape is filled here; tables built on the meta device are never filled here, as
    :func:`ctrkit.training.sharding.copy_weights` fills every rank's shards once, at their offsets, after sharding."""

    def fill(w: torch.Tensor) -> torch.Tensor:
        if on_meta or w.is_meta or tuple(w.shape) != (init.rows, init.dim):
            return w
        return init.fill(w.data)

    return fill


def ctrkit_name(torchrec_name: str) -> str:
    """A table's ctrkit name from its name inside torchrec (:meth:`TorchrecEmbeddingCollection.torchrec_name`)."""
    return torchrec_name.rsplit("#", 1)[0]


def _mean(sums: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Bag means (B, D) from bag sums (B, D) and lengths (B,); 0 for an empty bag."""
    return sums / lengths.clamp(min=1).unsqueeze(1).to(sums.dtype)


def _pool(rows: torch.Tensor, lengths: torch.Tensor, pooling: str) -> torch.Tensor:
    """Bags of jagged ``rows`` (n, D) with ``lengths`` (B,) -> (B, D): sums, or means (0 for an empty bag)."""
    bag = torch.repeat_interleave(torch.arange(lengths.numel(), device=rows.device), lengths,
                                  output_size=rows.shape[0])  # (n,) each row's bag
    out = rows.new_zeros(lengths.numel(), rows.shape[1]).index_add(0, bag, rows)  # (B, D)
    return _mean(out, lengths) if pooling == "mean" else out


def _torchrec_names(module: TorchrecEmbeddingCollection) -> dict[str, str]:
    """The torchrec state-dict name of every table (relative to the collection) -> ``tables.<table>``."""
    name = module.torchrec_name
    out = {f"ebc.embedding_bags.{name(n)}.weight": f"tables.{n}" for n in module._bag_tables}
    for n in module._seq_tables:
        out[f"ecs.d{module.tables[n].embedding_dim}.embeddings.{name(n)}.weight"] = f"tables.{n}"
    return out


def _rename_saved(module: TorchrecEmbeddingCollection, destination: dict[str, Any], prefix: str,
                  local_metadata: Any) -> None:
    for old, new in _torchrec_names(module).items():
        if prefix + old in destination:
            destination[prefix + new] = destination.pop(prefix + old)


def _rename_loaded(module: TorchrecEmbeddingCollection, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    for old, new in _torchrec_names(module).items():
        if prefix + new in state_dict:
            state_dict[prefix + old] = state_dict.pop(prefix + new)
