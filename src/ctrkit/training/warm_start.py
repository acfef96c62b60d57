"""Warm start (issue 28 item 2): a new run starts from a checkpoint's weights and optimizer states on a newer
vocabulary -- the same schema, each table with as many or more rows, every known value keeping its id
(:mod:`ctrkit.data.storage.lineage` checks that) -- instead of from scratch.

What a warm-started run holds before its first step:

- every table of the model (any backend, through the embedding interface's ``load_grown``): the checkpoint's rows
  first, then the rows of the new ids with the values a fresh table of the new size starts from (the model is built
  as for a new run, seeded by ``train.seed``, so these are its own initial rows: the same init rule and the same
  numbers as a cold start of the same seed);
- every other parameter and buffer: the checkpoint's. A buffer with a row per id (DIN's id counts) keeps its rows
  and leaves the new ids' rows as built (zero counts). Parts a model fits before training (``prefit``: GBDT+LR's
  trees, LR's dense means, DIN's counts) come from the checkpoint, not from the new data;
- the optimizers' states (dense, sparse / rowwise Adagrad / Adam, FTRL): the checkpoint's, each table's rows moved
  to where the table now starts in its weight (the fused backend holds the tables of one dim in one weight, so a
  grown table shifts the ones after it) and the new rows' states as a fresh optimizer has them. The learning rates
  and other settings are this run's. A checkpoint trained with another optimizer, or whose optimizer state does not
  match (another embedding backend), leaves the states fresh, with a warning. A sharded checkpoint into a sharded
  run also keeps the fused optimizers' states of its sharded tables (:mod:`ctrkit.training.sharded_warm`);
- progress, early stopping and RNG start anew: it is a new run, with its own run directory. So does the weight
  average (``train.ema_decay``), unless ``train.warm_start_average: keep``: then the checkpoint's average goes on
  over the new run's steps and training goes on from the checkpoint's trained weights (:func:`load_grown_average`),
  an average over periods whose window spans warm starts.

Expiry (``preprocess --grow --expire-after N``): the rows of the ids the new vocabulary reset (an evicted value's
id, freed or given to a new value: :func:`ctrkit.data.storage.lineage.reset_rows`) take their fresh initial values,
as new rows do, and so do their optimizer states and their rows of per-id buffers (a buffer named ``*_<table>``).

So right after growing, a row made only of known ids scores exactly as with the checkpoint (tests/training/
test_warm_start.py checks every registered model, both backends). Refused, with the table or feature named: a
checkpoint of another model, another schema (a feature added, removed or changed beyond its vocabulary size), a
table of another width or that shrank.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ctrkit.checkpoint import Checkpoint
from ctrkit.errors import CheckpointError, LayerConfigError
from ctrkit.models.base import CTRModel
from ctrkit.nn.embedding_interface import EmbeddingCollection
from ctrkit.schema import Schema
from ctrkit.training.averaging import WeightAverage

log = logging.getLogger(__name__)

# id(param) -> (old rows, [(old first row, new first row, rows)], the param's rows to reset (R,) int64)
Layout = dict[int, tuple[int, list[tuple[int, int, int]], torch.Tensor]]
Resets = Mapping[str, Sequence[int]]  # table -> ids whose rows start afresh (expiry)


def check_warm_start(ckpt: Checkpoint, model_name: str, schema: Schema, what: str) -> None:
    """A CheckpointError unless ``ckpt`` (read from option ``what``) is of model ``model_name`` and its schema is
    ``schema`` but for vocabulary sizes."""
    if ckpt.model_name != model_name:
        raise CheckpointError(f"{what}: {ckpt.source} is a checkpoint of model {ckpt.model_name!r}, and this run trains "
                              f"{model_name!r}; a warm start continues the same model: set model.name={ckpt.model_name}"
                              " or start without --warm-start")
    if ckpt.schema is None:
        raise CheckpointError(f"{what}: {ckpt.source} has no schema, so its tables cannot be matched to the new "
                              "store's; warm-start from a checkpoint written by `ctrkit train`")
    changes = schema_changes(ckpt.schema, schema)
    if changes:
        raise CheckpointError(f"{what}: the training store's schema differs from that of {ckpt.source} beyond "
                              f"vocabulary sizes ({'; '.join(changes)}); a warm start needs the same features: "
                              "preprocess the new data with the checkpoint's preprocessing options")


def schema_changes(old: Schema, new: Schema) -> list[str]:
    """What differs between two schemas besides vocabulary sizes ([] when nothing): features added, removed or
    changed (named, with the fields that differ), tables that shrank."""
    out = []
    a, b = old.to_dict(), new.to_dict()
    for kind in ("dense", "sparse", "sequence"):
        before = {f["name"]: {k: v for k, v in f.items() if k != "vocab_size"} for f in a[kind]}
        after = {f["name"]: {k: v for k, v in f.items() if k != "vocab_size"} for f in b[kind]}
        if gone := [n for n in before if n not in after]:
            out.append(f"{kind} features removed: {', '.join(gone)}")
        if added := [n for n in after if n not in before]:
            out.append(f"{kind} features added: {', '.join(added)}")
        for n in (n for n in before if n in after and before[n] != after[n]):
            diff = [f"{k} {before[n].get(k)!r} -> {after[n].get(k)!r}" for k in {**before[n], **after[n]}
                    if before[n].get(k) != after[n].get(k)]
            out.append(f"{kind} feature {n!r}: {', '.join(diff)}")
    out += [f"{k} {a[k]!r} -> {b[k]!r}" for k in ("label", "weight", "group_id", "item_id", "auto_dim_rule")
            if a[k] != b[k]]
    old_t, new_t = old.tables(), new.tables()
    out += [f"table {n!r} shrank from {t.num_embeddings} to {new_t[n].num_embeddings} rows" for n, t in old_t.items()
            if n in new_t and new_t[n].num_embeddings < t.num_embeddings]
    return out


def _collections(model: nn.Module) -> dict[str, EmbeddingCollection]:
    """State-dict prefix -> every embedding collection of ``model``."""
    return {f"{path}." if path else "": m for path, m in model.named_modules() if isinstance(m, EmbeddingCollection)}


@torch.no_grad()
def load_grown_weights(model: CTRModel, ckpt: Checkpoint, params: Mapping[str, Any] | None = None,
                       what: str = "--warm-start", reset: Resets | None = None) -> dict[str, tuple[int, int]]:
    """``model`` (built for the new vocabulary with ``params``, tables freshly initialised) <- the checkpoint's
    weights, its tables grown, the rows ``reset`` {table: ids} left fresh (module docstring). Returns {table
    state-dict key: (old rows, new rows)}; a CheckpointError names what does not fit."""
    weights, grown = ckpt.weights, {}
    internal: set[str] = set()  # the collections' own names of their tables (missing from the load below)
    for prefix, m in _collections(model).items():
        try:
            sizes = m.load_grown(weights, prefix, reset)
        except LayerConfigError as e:
            raise CheckpointError(f"{what}: {ckpt.source} does not fit model {ckpt.model_name!r} on the new "
                                  f"vocabulary: {e}") from None
        grown.update({f"{prefix}tables.{t}": rows for t, rows in sizes.items()})
        internal |= {prefix + n for n, _ in m.named_parameters()}
    pairs = {rows for rows in grown.values() if rows[0] != rows[1]}
    current = model.state_dict()
    rest = {k: _reset_buffer(k, _grown_buffer(v, current.get(k), pairs), current.get(k), reset or {})
            for k, v in weights.items() if k not in grown}
    try:
        missing, unexpected = model.load_state_dict(rest, strict=False)
    except RuntimeError as e:
        raise CheckpointError(f"{what}: the weights of {ckpt.source} do not fit model {ckpt.model_name!r} with "
                              f"this run's parameters ({_params_diff(ckpt, params)}): {e}") from None
    missing = [k for k in missing if k not in grown and k not in internal]
    if missing or unexpected:
        raise CheckpointError(f"{what}: {ckpt.source} does not fit model {ckpt.model_name!r} with this run's "
                              f"parameters ({_params_diff(ckpt, params)}): missing {missing[:5]}, unexpected "
                              f"{unexpected[:5]}")
    changed = {k: v for k, v in grown.items() if v[0] != v[1]}
    log.info("warm start from %s: %d tables, %d grown %s", ckpt.source, len(grown), len(changed),
             {k: f"{a} -> {b}" for k, (a, b) in changed.items()})
    return grown


@torch.no_grad()
def new_rows_from_rare(model: CTRModel, grown: Mapping[str, tuple[int, int]], reset: Resets | None = None) -> int:
    """``train.warm_start_new_rows: rare``: every new row of every grown table (ids old rows .. new rows, and the
    rows ``reset`` by expiry) <- that table's row 1, the row of values the vocabulary did not hold, which scored
    these values until now (trained when ``train.id_dropout`` or ``min_freq`` > 1 sent ids to it). A value then
    starts from what the model knew of unknown values instead of a fresh row. ``grown``: :func:`load_grown_weights`'
    {table state-dict key: (old rows, new rows)}. Returns how many rows were set."""
    done = 0
    for prefix, m in _collections(model).items():
        for p, starts in m.table_rows():
            for t, at in starts.items():
                old, new = grown.get(f"{prefix}tables.{t}", (0, 0))
                rows = np.r_[np.arange(old, new), np.asarray((reset or {}).get(t, ()), np.int64)]
                rows = rows[rows > 1]
                if old > 1 and len(rows):
                    idx = torch.as_tensor(at + rows, device=p.device)
                    p.data[idx] = p.data[at + 1].clone().expand(len(rows), *p.shape[1:])
                    done += len(rows)
    return done


def _grown_buffer(old: Any, new: Any, pairs: set[tuple[int, int]]) -> Any:
    """``old`` as the entry to load: itself, or, for an entry with a row per id of a grown table (its rows match
    one table's (old, new) rows, the rest of its shape the same), the new entry with its first rows from ``old``."""
    if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)) or old.dim() == 0 or old.shape == new.shape:
        return old
    if old.shape[1:] != new.shape[1:] or (int(old.shape[0]), int(new.shape[0])) not in pairs:
        return old  # load_state_dict reports the mismatch, or the module loads it its own way (GBDT+LR's trees)
    out = new.clone()
    out[: old.shape[0]] = old
    return out


def _reset_buffer(key: str, old: Any, new: Any, reset: Resets) -> Any:
    """``old`` with the rows of reset ids as built (``new``) when it is a buffer with a row per id of a table with
    rows to reset (named ``..._<table>``, as DIN's id counts ``counts_<table>``, of the table's rows)."""
    name = key.rsplit(".", 1)[-1]
    ids = next((r for t, r in reset.items() if name.endswith(f"_{t}") and len(r)), None)
    if ids is None or not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)) or old.shape != new.shape \
            or old.dim() == 0 or int(max(ids)) >= old.shape[0]:
        return old
    out = old.clone()
    idx = torch.as_tensor(np.asarray(ids, np.int64))
    out[idx] = new[idx].to(out.dtype)
    return out


def _params_diff(ckpt: Checkpoint, now: Mapping[str, Any] | None) -> str:
    if now is None:
        return "compare model.params with the checkpoint's"
    diff = [f"{k}: {ckpt.model_params.get(k)!r} -> {now.get(k)!r}" for k in {**ckpt.model_params, **now}
            if k != "embedding_backend" and ckpt.model_params.get(k) != now.get(k)]
    return "model.params differ: " + ", ".join(diff) if diff else "same model.params"


def table_layout(model: nn.Module, weights: Mapping[str, torch.Tensor], reset: Resets | None = None) -> Layout:
    """For every table parameter of ``model`` (new vocabulary): its rows in the checkpoint (``weights``, old
    vocabulary, same backend), where each table's old rows go: [(old first row, new first row, old rows)], and its
    rows that start afresh (``reset`` {table: ids}, at the table's first row)."""
    out: Layout = {}
    for prefix, m in _collections(model).items():
        for p, starts in m.table_rows():
            at, segs, rows = 0, [], []
            for t, new_at in sorted(starts.items(), key=lambda kv: kv[1]):
                n = int(weights[f"{prefix}tables.{t}"].shape[0])
                segs.append((at, new_at, n))
                rows.append(new_at + np.asarray((reset or {}).get(t, ()), np.int64))
                at += n
            out[id(p)] = (at, segs, torch.as_tensor(np.concatenate(rows) if rows else np.zeros(0, np.int64)))
    return out


def load_grown_optimizer(optimizer: Any, ckpt: Checkpoint, layout: Layout, same: Mapping[str, bool],
                         what: str = "--warm-start") -> list[str]:
    """The checkpoint's optimizer states into ``optimizer`` (an :class:`~ctrkit.training.optim.OptimizerSet`), the
    table rows moved by ``layout`` (:func:`table_layout`); ``same``: part ("dense", "sparse", "wide") -> whether
    this run uses the optimizer the checkpoint's did. Returns the parts loaded; the others stay fresh (warned)."""
    saved, loaded = ckpt.optimizer or {}, []
    for part in ("dense", "sparse", "wide"):
        opt, state = getattr(optimizer, part, None), saved.get(part)
        if opt is None:
            continue
        why = ("the checkpoint holds none" if state is None else
               "the checkpoint was trained with another optimizer" if not same.get(part, False) else None)
        if why is None:
            try:
                opt.load_state_dict(_grown_state(opt, state, layout))
                loaded.append(part)
                continue
            except _Mismatch as e:
                why = str(e)
        log.warning("%s: the %s optimizer starts with fresh state: %s (%s)", what, part, why, ckpt.source)
    return loaded


class _Mismatch(Exception):
    pass


def _grown_state(opt: torch.optim.Optimizer, saved: dict[str, Any], layout: Layout) -> dict[str, Any]:
    """``opt``'s state dict (its own settings) holding ``saved``'s per-parameter states, grown by ``layout``."""
    params = [p for g in opt.param_groups for p in g["params"]]
    old_ids = [i for g in saved["param_groups"] for i in g["params"]]
    if len(params) != len(old_ids):
        raise _Mismatch(f"it has {len(old_ids)} parameters in the checkpoint and {len(params)} here (another "
                        "embedding backend or sharding plan)")
    current = opt.state_dict()
    new_ids = [i for g in current["param_groups"] for i in g["params"]]
    state = {}
    for p, old_i, new_i in zip(params, old_ids, new_ids):
        s = saved["state"].get(old_i)
        if s is not None:
            fresh = opt.state.get(p, {})
            state[new_i] = {k: _grown_rows(v, p, layout.get(id(p)), fresh.get(k)) for k, v in s.items()}
    current["state"] = state
    return current


def _grown_rows(v: Any, p: torch.Tensor, rows: tuple[int, list[tuple[int, int, int]], torch.Tensor] | None,
                fresh: Any) -> Any:
    """One state entry of parameter ``p``: as saved, or a per-row state [old rows, ...] moved to the grown rows, the
    rows to reset as a fresh optimizer has them."""
    reset = rows[2] if rows is not None else None
    if not isinstance(v, torch.Tensor) or v.dim() == 0 or (v.shape[0] == p.shape[0] and (reset is None or not len(reset))):
        if isinstance(v, torch.Tensor) and v.dim() and rows is not None and rows[0] != v.shape[0]:
            raise _Mismatch(f"a state of shape {tuple(v.shape)} for a table weight of {rows[0]} rows")
        return v
    old_rows, segs = rows[:2] if rows is not None else (int(v.shape[0]), [(0, 0, int(v.shape[0]))])  # one table
    if v.shape[0] != old_rows or old_rows > p.shape[0]:
        raise _Mismatch(f"a state of shape {tuple(v.shape)} does not fit a weight of shape {tuple(p.shape)}")
    shape = (p.shape[0], *v.shape[1:])
    base = fresh.detach() if isinstance(fresh, torch.Tensor) and tuple(fresh.shape) == shape else v.new_zeros(shape)
    out = base.clone()
    for o, n, k in segs:
        out[n: n + k] = v[o: o + k].to(out.device)
    if reset is not None and len(reset):
        out[reset.to(out.device)] = base[reset.to(base.device)].to(out.device)
    return out


@torch.no_grad()
def load_grown_average(average: WeightAverage, model: nn.Module, ckpt: Checkpoint, reset: Resets | None = None,
                       what: str = "--warm-start") -> int:
    """``train.warm_start_average: keep``: the checkpoint's weight average goes on in ``average`` (this run's
    :class:`~ctrkit.training.averaging.WeightAverage` of ``model``, whose weights :func:`load_grown_weights` just set
    to the checkpoint's average a_t, grown) as a resume would: the accumulators hold a_t (new and reset rows: their
    fresh values, as if constant so far) and training goes on from the checkpoint's trained weights w_t, grown by
    :func:`table_layout`. Returns the number of updates the average carries."""
    state = ckpt.trainer.weight_average if ckpt.trainer is not None else None
    if state is None:
        raise CheckpointError(f"{what}: train.warm_start_average=keep continues the checkpoint's weight average, and "
                              f"{ckpt.source} holds none (trained without train.ema_decay, or not a training "
                              "checkpoint); set train.warm_start_average=fresh")
    if abs(float(state["decay"]) - average.decay) > 1e-12:
        raise CheckpointError(f"{what}: {ckpt.source} averaged its weights with train.ema_decay={state['decay']}, this "
                              f"run asks for {average.decay}; with train.warm_start_average=keep use the checkpoint's "
                              "value (or set train.warm_start_average=fresh)")
    raw = state["raw"]
    if missing := [n for n in average.names if n not in raw]:
        raise CheckpointError(f"{what}: the weight average of {ckpt.source} lacks the trained weights of {missing[:5]}")
    layout = table_layout(model, ckpt.weights, reset)
    updates = int(state["updates"])
    average.debias = bool(state.get("debias", True))  # an average started at weights (start) goes on undebiased
    scale = average.accumulated_weight(updates)
    for acc, name, p in zip(average.acc, average.names, average.params, strict=True):
        a = p.detach().clone()  # a_t, grown: new and reset rows fresh
        acc.copy_(a * scale)
        try:
            p.copy_(_grown_rows(raw[name].to(p.device), p, layout.get(id(p)), a))
        except _Mismatch as e:
            raise CheckpointError(f"{what}: the trained weights {name!r} of {ckpt.source}'s weight average do not fit "
                                  f"this model: {e}") from None
    average.updates = updates
    for cur in average.current.values():
        cur.fill_(updates)
    return updates
