"""Batches: ``KeyedJagged`` sparse ids and the ``Batch`` every model takes.

``KeyedJagged`` is the layout of torchrec's KeyedJaggedTensor (seed 000 §3.3). For keys k_0..k_{F-1}
and a batch of B rows, ``lengths`` has F*B entries, key-major: ``lengths[f*B + b]`` is how many ids
row b has for key f. ``values`` holds the ids in the same order (all of key 0's rows, then key 1's,
...), and ``offsets`` = [0, cumsum(lengths)] has F*B + 1 entries. Example from the seed, B = 2, four
single-valued keys: values = [I00, I10, I01, I11, I02, I12, I03, I13], offsets = [0, 1, ..., 8];
after multi-hot expansion of key 3 (3 ids per row) offsets become [0, 1, 2, 3, 4, 5, 6, 9, 12].

Under ``torch.export`` (``torch.compiler.is_exporting()``, see :mod:`ctrkit.serving.export`) the batch size B
stays symbolic and nothing reads tensor values on the host: ``select`` then moves the ids with a scatter
instead of slicing per key, and its result keeps the ids of the keys left out after ``offsets[-1]`` (so
``values`` has a length known before the ids are read). Everything that reads a KeyedJagged under export
(``to_padded``, ``take``, ``bag_index`` and the embedding collections) reads ids through ``offsets`` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ctrkit.errors import BatchError, BatchTypeError, UnknownKeyError


class KeyedJagged:
    """Jagged int64 ids for F keys over B rows, stored key-major (see module docstring)."""

    def __init__(
        self,
        keys: Sequence[str],
        values: torch.Tensor,
        lengths: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
        stride: int | None = None,
        weights: torch.Tensor | None = None,
    ) -> None:
        self.keys: list[str] = list(keys)
        if len(set(self.keys)) != len(self.keys):
            raise BatchError(f"KeyedJagged keys must be unique, got {self.keys}")
        if values.dtype != torch.int64:
            raise BatchTypeError(f"KeyedJagged values must be int64 ids, got {values.dtype}")
        self.values = values
        self.weights = weights
        if lengths is None and offsets is None:
            raise BatchError("KeyedJagged needs lengths or offsets")
        if lengths is None:
            lengths = torch.diff(offsets)
        if offsets is None:
            offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
            torch.cumsum(lengths, 0, out=offsets[1:])
        self.lengths = lengths.to(torch.int64)
        self.offsets = offsets.to(torch.int64)
        F = len(self.keys)
        if stride is None:
            stride = self.lengths.numel() // F if F else 0
        self.stride = stride if isinstance(stride, torch.SymInt) else int(stride)  # symbolic under torch.export
        if self.lengths.numel() != F * self.stride:
            raise BatchError(
                f"KeyedJagged has {self.lengths.numel()} lengths for {F} keys x stride {self.stride}; "
                f"expected {F * self.stride}"
            )
        if self.offsets.numel() != self.lengths.numel() + 1:
            raise BatchError("KeyedJagged offsets must have len(lengths) + 1 entries")
        if weights is not None and weights.numel() != values.numel():
            raise BatchError("KeyedJagged weights must have one entry per value")
        self._length_per_key: list[int] | None = None

    # ---- torchrec-style accessors --------------------------------------------------------------
    @classmethod
    def from_dense(cls, keys: Sequence[str], ids: torch.Tensor) -> KeyedJagged:
        """Single-valued ids [B, F] (one per key and row) -> KeyedJagged with all lengths 1."""
        B, F = ids.shape
        if F != len(keys):
            raise BatchError(f"from_dense: ids have {F} columns but {len(keys)} keys were given")
        values = ids.t().reshape(-1).to(torch.int64)  # key-major ("column first", seed 000 §3.3)
        lengths = torch.ones(F * B, dtype=torch.int64, device=ids.device)
        return cls(keys, values, lengths=lengths, stride=B)

    @classmethod
    def from_per_key(
        cls, per_key: dict[str, tuple[torch.Tensor, torch.Tensor]], stride: int | None = None
    ) -> KeyedJagged:
        """Build from {key: (values, lengths[B])} in the dict's order."""
        keys = list(per_key)
        if not keys:
            return cls([], torch.zeros(0, dtype=torch.int64), lengths=torch.zeros(0, dtype=torch.int64),
                       stride=stride or 0)
        values = torch.cat([per_key[k][0].to(torch.int64) for k in keys])
        lengths = torch.cat([per_key[k][1].to(torch.int64) for k in keys])
        return cls(keys, values, lengths=lengths, stride=per_key[keys[0]][1].numel())

    def length_per_key(self) -> list[int]:
        if self._length_per_key is None:
            self._length_per_key = self.lengths.view(len(self.keys), self.stride).sum(1).tolist()
        return self._length_per_key

    def offset_per_key(self) -> list[int]:
        out = [0]
        for n in self.length_per_key():
            out.append(out[-1] + n)
        return out

    def lengths_2d(self) -> torch.Tensor:
        """Lengths as [F, B]."""
        return self.lengths.view(len(self.keys), self.stride)

    def to_dict(self) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """{key: (values, lengths[B], offsets[B+1] starting at 0)} as in seed 000 §3.3."""
        out = {}
        opk = self.offset_per_key()
        L = self.lengths_2d()
        for i, k in enumerate(self.keys):
            lengths = L[i]
            offsets = self.offsets[i * self.stride : (i + 1) * self.stride + 1] - opk[i]
            out[k] = (self.values[opk[i] : opk[i + 1]], lengths, offsets)
        return out

    def __getitem__(self, key: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        i = self._index(key)
        opk = self.offset_per_key()
        offsets = self.offsets[i * self.stride : (i + 1) * self.stride + 1] - opk[i]
        return self.values[opk[i] : opk[i + 1]], self.lengths_2d()[i], offsets

    def _index(self, key: str) -> int:
        try:
            return self.keys.index(key)
        except ValueError:
            raise UnknownKeyError(f"KeyedJagged has no key {key!r}; keys: {self.keys}") from None

    def select(self, keys: Sequence[str]) -> KeyedJagged:
        """A KeyedJagged with only ``keys``, in the order given (also a permutation)."""
        idx = [self._index(k) for k in keys]
        if torch.compiler.is_exporting():
            return self._select_exported(list(keys), idx)
        opk = self.offset_per_key()
        vals = [self.values[opk[i] : opk[i + 1]] for i in idx]
        wts = [self.weights[opk[i] : opk[i + 1]] for i in idx] if self.weights is not None else None
        L = self.lengths_2d()
        empty = self.values.new_zeros(0)
        return KeyedJagged(
            list(keys),
            torch.cat(vals) if vals else empty,
            lengths=L[idx].reshape(-1) if idx else self.lengths.new_zeros(0),
            stride=self.stride,
            weights=torch.cat(wts) if wts else None,
        )

    def _select_exported(self, keys: list[str], idx: list[int]) -> KeyedJagged:
        """``select`` without host syncs: every id moves to its place in the key order ``idx`` + the keys left
        out, by one scatter; the result's ``values`` keep the left-out ids after its ``offsets[-1]``."""
        F, B = len(self.keys), self.stride
        order = idx + [i for i in range(F) if i not in idx]
        new_key = torch.tensor([order.index(i) for i in range(F)] + [F], device=self.values.device)  # (F + 1,)
        bag = self.bag_index()  # (nnz,) in [0, F*B]
        key = torch.div(bag, B, rounding_mode="floor")  # (nnz,) in [0, F]
        new_bag = new_key[key] * B + (bag - key * B)  # (nnz,)
        # the permuted bags, then one bag of whatever followed offsets[-1]
        tail = (self.values.shape[0] - self.offsets[-1:]).to(torch.int64)  # (1,)
        lengths = torch.cat([self.lengths_2d()[order].reshape(-1), tail])  # (F*B + 1,)
        starts = torch.cumsum(lengths, 0) - lengths  # (F*B + 1,) exclusive cumsum
        pos = torch.arange(self.values.shape[0], device=self.values.device)  # (nnz,)
        dest = starts[new_bag] + pos - self.offsets[bag]  # (nnz,) a permutation of 0..nnz-1
        values = torch.zeros_like(self.values).index_copy(0, dest, self.values)
        weights = None if self.weights is None else torch.zeros_like(self.weights).index_copy(0, dest, self.weights)
        return KeyedJagged(keys, values, lengths=lengths[: len(idx) * B], stride=B, weights=weights)

    def bag_index(self) -> torch.Tensor:
        """(nnz,) the bag ``f*B + b`` of every id; ids after ``offsets[-1]`` (see the module docstring) get F*B.
        No host sync: ``cumsum`` of a count of bag ends at each position."""
        n = self.values.shape[0]
        ends = torch.zeros(n + 1, dtype=torch.int64, device=self.values.device)
        ends = ends.index_add(0, self.offsets[1:], torch.ones_like(self.lengths))  # (nnz + 1,) bags ending at p
        return torch.cumsum(ends, 0)[:n]

    def bag_sums(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows of the ids (nnz, D) summed per bag -> (F, B, D); rows of ids after ``offsets[-1]`` are dropped.
        No host sync (one ``index_add``)."""
        F, B = len(self.keys), self.stride
        sums = rows.new_zeros(F * B + 1, rows.shape[1]).index_add(0, self.bag_index(), rows)  # (F*B + 1, D)
        return sums[: F * B].view(F, B, rows.shape[1])

    def take(self, positions: torch.Tensor, mask: torch.Tensor, pad: int = 0) -> torch.Tensor:
        """``values[positions]`` where ``mask``, else ``pad`` (same shape as ``positions``); positions under a
        False mask are never read, so any value works there, and no values at all is fine."""
        values = self.values
        if torch.compiler.is_exporting():  # no branch on the number of ids: a pad id to index when there are none
            values = torch.cat([values, values.new_zeros(1)])
        elif not values.numel():
            return torch.full_like(positions, pad)
        ids = values[torch.where(mask, positions, torch.zeros_like(positions))]
        return torch.where(mask, ids, torch.full_like(ids, pad))

    def bags(self, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lengths (B,), starts (B,))`` of ``key``: row b's ids are ``values[starts[b] : starts[b] + lengths[b]]``
        (positions in the whole ``values``; no host sync)."""
        i, B = self._index(key), self.stride
        return self.lengths_2d()[i], self.offsets[i * B : (i + 1) * B]

    def permute(self, order: Sequence[int]) -> KeyedJagged:
        return self.select([self.keys[i] for i in order])

    def to_padded(self, key: str, max_len: int, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Ids of ``key`` as ([B, T] ids, [B, T] bool mask), T = max_len; longer rows keep their last
        ``max_len`` ids (the most recent, for histories stored oldest first)."""
        lengths, starts = self.bags(key)  # (B,) each
        T = int(max_len)
        # position t of row b reads values[starts[b] + skip[b] + t], skip = max(0, len - T)
        skip = (lengths - T).clamp(min=0)
        kept = lengths.clamp(max=T)
        t = torch.arange(T, device=self.values.device)
        mask = t.unsqueeze(0) < kept.unsqueeze(1)  # (B, T)
        idx = (starts + skip).unsqueeze(1) + t.unsqueeze(0)  # (B, T)
        return self.take(idx, mask, pad), mask

    def to(self, device: torch.device | str, non_blocking: bool = False) -> KeyedJagged:
        out = KeyedJagged(
            self.keys,
            self.values.to(device, non_blocking=non_blocking),
            lengths=self.lengths.to(device, non_blocking=non_blocking),
            offsets=self.offsets.to(device, non_blocking=non_blocking),
            stride=self.stride,
            weights=None if self.weights is None else self.weights.to(device, non_blocking=non_blocking),
        )
        out._length_per_key = self._length_per_key
        return out

    def __repr__(self) -> str:
        return f"KeyedJagged(keys={self.keys}, stride={self.stride}, values={self.values.numel()})"


@dataclass
class Batch:
    """One mini-batch. ``dense`` [B, Nd] float32, ``sparse`` KeyedJagged over the schema's sparse
    keys, ``labels`` [B] float32, optional ``weights`` [B] and ``group_ids`` [B] (for GAUC)."""

    dense: torch.Tensor
    sparse: KeyedJagged
    labels: torch.Tensor
    weights: torch.Tensor | None = None
    group_ids: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def batch_size(self) -> int:
        """B; symbolic under ``torch.export``, where ``len(batch)`` would fix it to the example's."""
        return self.labels.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return Batch(
            dense=self.dense.to(device, non_blocking=non_blocking),
            sparse=self.sparse.to(device, non_blocking=non_blocking),
            labels=self.labels.to(device, non_blocking=non_blocking),
            weights=mv(self.weights),
            group_ids=mv(self.group_ids),
        )
