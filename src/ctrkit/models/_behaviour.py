"""What the user-behaviour models (din, dien, dsin, bst and the ``dnn`` baseline) read from a schema, and
the one embedding block they share. Not a model module (leading underscore: not auto-imported).

Roles are what the schema declares (:class:`ctrkit.schema.SequenceFeature` ``role``, ``of``, ``session``
and the table a sequence ``shares``), never a feature's name:

- a **history** is an unpooled sequence (pooling "none") of role "history"; its **target** is the
  single-valued sparse feature embedded by the same table (group "item" preferred): the behaviour store's
  ``hist_item`` <-> ``item``, ``hist_cate`` <-> ``cate``. All histories describe the same behaviours, so they
  share one ``max_len`` and their embeddings are concatenated per step: behaviour t = [e(item_t); e(cate_t)]
  (B, T, Dt), target = [e(item); e(cate)] (B, Dt);
- DIEN's sampled negatives: role "negative", ``of`` its history (one per history step, built by the data path);
- DSIN's sessions: role "session", number ``session`` (0 .. S-1, oldest first), matched to the histories by
  table;
- every other sparse feature and pooled sequence (user, context, ...) is an **other** field, pooled and
  concatenated (B, Do).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.models.registry import ConfigError
from ctrkit.nn.embedding_factory import make_embeddings
from ctrkit.nn.inputs import ZOO_INIT_STD
from ctrkit.nn.sequence import mba_l2
from ctrkit.schema import Schema, SequenceFeature


@dataclass
class BehaviourFields:
    """The roles of a schema's features for a behaviour model (see the module docstring)."""

    targets: list[str] = field(default_factory=list)  # target of each history, in history order
    histories: list[str] = field(default_factory=list)
    negatives: list[str] = field(default_factory=list)  # neg_<history>, when present for every history
    sessions: list[list[str]] = field(default_factory=list)  # sessions[k] = the histories' sess_<k>_<x>
    others: list[str] = field(default_factory=list)
    max_len: int = 0  # T of the histories
    session_len: int = 0  # T of the sessions


def _target_of(schema: Schema, seq: SequenceFeature, model: str) -> str:
    table = schema.table_of(seq.name)
    candidates = [s for s in schema.sparse if s.table_name == table and not s.multi_valued]
    candidates.sort(key=lambda s: s.group != "item")  # the item group's feature first
    if not candidates:
        raise ConfigError(
            f"{model}: history {seq.name!r} embeds with table {table!r}, but no single-valued sparse feature "
            f"uses that table to be its target; add the target feature (e.g. {table!r}) to the schema"
        )
    return candidates[0].name


def behaviour_fields(schema: Schema, model: str, *, need_history: bool = True) -> BehaviourFields:
    """The histories and their targets, DIEN's negatives, DSIN's sessions and the other fields, as the schema
    declares them (:meth:`Schema.sequences`: role "history" / "negative" / "session", each sharing a table)."""
    out = BehaviourFields(histories=schema.sequences("history"))
    if need_history and not out.histories:
        raise ConfigError(
            f"{model} needs a behaviour history: an unpooled sequence feature (pooling 'none', role 'history') "
            f"sharing the item table; the schema's sequences are "
            f"{[(q.name, q.pooling, q.role) for q in schema.sequence] or 'none'} (behaviour stores have them)"
        )
    lens = {h: _sequence(schema, h).max_len for h in out.histories}
    if len(set(lens.values())) > 1:
        raise ConfigError(f"{model}: the histories describe the same behaviours and need one max_len, got {lens}")
    out.max_len = next(iter(lens.values()), 0)
    out.targets = [_target_of(schema, _sequence(schema, h), model) for h in out.histories]
    negative_of = {_sequence(schema, n).of: n for n in schema.sequences("negative")}
    if out.histories and all(h in negative_of for h in out.histories):
        out.negatives = [negative_of[h] for h in out.histories]
    _session_fields(schema, model, out)
    used = set(out.targets)
    out.others = [k for k in schema.pooled_keys if k not in used]
    return out


def _sequence(schema: Schema, name: str) -> SequenceFeature:
    q = schema.feature(name)
    assert isinstance(q, SequenceFeature)
    return q


def _session_fields(schema: Schema, model: str, out: BehaviourFields) -> None:
    """DSIN's sessions: ``out.sessions[k]`` = session k's sequences, one per history in the histories' order
    (matched by table); without histories, in name order. Sets ``session_len`` (and the targets if unset)."""
    sessions: dict[int, list[SequenceFeature]] = {}
    for name in schema.sequences("session"):
        q = _sequence(schema, name)
        sessions.setdefault(int(q.session or 0), []).append(q)
    if not sessions:
        return
    tables = [schema.table_of(h) for h in out.histories]
    for k in sorted(sessions):
        by_table = {schema.table_of(q.name): q.name for q in sessions[k]}
        if not tables:
            out.sessions.append(sorted(q.name for q in sessions[k]))
            continue
        missing = [h for h, t in zip(out.histories, tables) if t not in by_table]
        if missing or len(by_table) != len(sessions[k]):
            raise ConfigError(f"{model}: session {k} has {sorted(q.name for q in sessions[k])}; every session needs "
                              f"one sequence per history {out.histories}, sharing its table")
        out.sessions.append([by_table[t] for t in tables])
    slens = {q.max_len for s in sessions.values() for q in s}
    if len(slens) > 1:
        raise ConfigError(f"{model}: all session sequences need one max_len, got {sorted(slens)}")
    out.session_len = slens.pop()
    if not out.targets:
        out.targets = [_target_of(schema, _sequence(schema, n), model) for n in out.sessions[0]]


def _trim(emb: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop trailing positions that are padding in every row (rows are left-aligned): the layers' results
    do not change, the work shrinks from max_len to the batch's longest history. Under ``torch.export`` the
    full max_len is kept (the length of a program's tensors cannot depend on the ids it reads)."""
    if torch.compiler.is_exporting():
        return emb, mask
    n = int(mask.sum(1).max()) if mask.numel() else 0
    n = max(n, 1)  # keep one (masked) step so shapes stay (B, >=1, D)
    return emb[:, :n], mask[:, :n]


class BehaviourEmbedding(nn.Module):
    """One embedding collection for a behaviour model: ``others`` (B, Do), ``target`` (B, Dt) and unpooled
    behaviour sequences (B, T, Dt) with their mask (B, T), each the concatenation over the attributes.

    ``sequence_keys``: every unpooled sequence the model reads (histories, negatives, sessions).
    """

    def __init__(self, schema: Schema, fields: BehaviourFields, sequence_keys: Sequence[str]) -> None:
        super().__init__()
        self.fields = fields
        pooled = [*fields.targets, *fields.others]
        self.embedding = make_embeddings(schema, pooled, sequence_keys=list(sequence_keys), init="normal",
                                         std=ZOO_INIT_STD)
        dims = dict(zip(self.embedding.keys, self.embedding.dims))  # what the tables were built with
        self.target_dim = sum(dims[t] for t in fields.targets)
        self.other_dim = sum(dims[k] for k in fields.others)

    def pooled(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(target (B, Dt), others (B, Do))``; Do = 0 gives an empty (B, 0) tensor."""
        d = self.embedding.pooled(batch.sparse).to_dict()
        empty = batch.dense.new_zeros(batch.batch_size, 0)

        def cat(keys: list[str]) -> torch.Tensor:
            return torch.cat([d[k] for k in keys], 1) if keys else empty

        return cat(self.fields.targets), cat(self.fields.others)  # (B, Dt), (B, Do)

    def sequence(self, kj: KeyedJagged, keys: Iterable[str], *, trim: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Behaviours of the attribute sequences ``keys`` -> ``(emb (B, T, Dt), mask (B, T))``; the mask
        is the first key's (the attributes of one behaviour come together)."""
        parts, mask = [], None
        for k in keys:
            e, m = self.embedding.sequence(kj, k)  # (B, T, D_k), (B, T)
            parts.append(e)
            mask = m if mask is None else mask
        assert mask is not None
        emb = torch.cat(parts, -1) if len(parts) > 1 else parts[0]  # (B, T, Dt)
        return _trim(emb, mask) if trim else (emb, mask)


class IdFrequency(nn.Module):
    """Training-data occurrence counts n_j of every id of the tables a behaviour model reads, and DIN's
    mini-batch-aware L2 over them (Zhou et al. 2018, eq. 4; seed 002 "mini batch aware regularization")::

        L2(W) = lam * sum_j  1[j in batch] * ||w_j||^2 / n_j          (id 0 = padding / missing skipped)

    only rows present in the batch are penalised, rare ids more than frequent ones. ``count(kj)`` adds a
    training batch's ids (the model's ``prefit``); unseen ids count as 1. Counts are buffers, so a
    checkpoint carries them and a resumed run penalises as the first one did.
    """

    def __init__(self, schema: Schema, keys: Sequence[str]) -> None:
        super().__init__()
        self.keys = list(keys)
        self.table_keys: dict[str, list[str]] = {}
        for k in self.keys:
            self.table_keys.setdefault(schema.table_of(k), []).append(k)
        sizes = {t.name: t.num_embeddings for t in schema.tables().values()}
        for t in self.table_keys:
            self.register_buffer(f"counts_{t}", torch.zeros(sizes[t]))

    def counts(self, table: str) -> torch.Tensor:
        return self.get_buffer(f"counts_{table}")

    def _ids(self, kj: KeyedJagged, table: str) -> torch.Tensor:
        return torch.cat([kj[k][0] for k in self.table_keys[table]])  # (nnz,) every id of the table's features

    @torch.no_grad()
    def count(self, kj: KeyedJagged) -> None:
        for t in self.table_keys:
            c = self.counts(t)
            c += torch.bincount(self._ids(kj, t), minlength=c.numel()).to(c.dtype)

    def penalty(self, embedding: nn.Module, kj: KeyedJagged, lam: float) -> torch.Tensor:
        """``lam * sum_{j in batch, j != 0} ||w_j||^2 / max(n_j, 1)`` over every table, through
        ``embedding.lookup`` (any backend)."""
        total = torch.zeros((), device=kj.values.device)
        for t in self.table_keys:
            total = total + mba_l2(partial(embedding.lookup, t), self._ids(kj, t), self.counts(t), lam)
        return total
