"""Multi-hot expansion of single-valued sparse features (seed 000 §3.3, MLPerf DLRM v2 ``multi_hot.py``).

Each feature i with ``num_embeddings[i] >= multi_hot_min_table_size`` gets a fixed, non-trainable
lookup table ``weight[i]`` of shape [num_embeddings[i], m_i] with entries in
[0, num_embeddings[i]), generated with random seed i (``np.random.seed(i)`` semantics, so every
process builds the same tables):

* ``uniform``: ``randint(0, n, size=(n, m))``;
* ``pareto`` : ``floor(pareto(a=0.25, size=(n, m))) mod n`` (as the MLPerf reference; draws above
  2^62 are clipped before the modulo so the integer cast is defined).

``multi_hot_size`` gives m_i: one size for every feature (seed 000), or one per feature (MLPerf DLRM-DCNv2's
per-table sizes, e.g. [3, 2, 1, 2, 6, ...] for C1..C26; a feature of size 1 keeps its one id).

For a batch, an expanded feature's ids x [B] become ``embedding(x, weight[i])`` [B, m_i] with column 0
replaced by x itself, flattened row-major into [B * m_i]; its lengths become m_i and the offsets are
recomputed, so the KeyedJagged stays key-major. Features below the threshold are passed unchanged.
Worked example (B = 2, num_embeddings = [6, 7, 5, 9], min_table_size = 8, m = 3): values
[I00, I10, I01, I11, I02, I12, I03, I03^1, I03^2, I13, I13^1, I13^2], offsets [0, 1, 2, 3, 4, 5, 6, 9, 12].

With ``collect_freqs`` the occurrence count of every id before (``pre``) and after (``post``) the
expansion is accumulated per feature and written by ``save_freqs``; nothing else uses it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ctrkit.batch import KeyedJagged
from ctrkit.errors import DataError
from ctrkit.schema import Schema

DISTRIBUTIONS = ("uniform", "pareto")
_PARETO_CLIP = float(2**62)


def multi_hot_table(num_embeddings: int, multi_hot_size: int, seed: int, distribution: str = "uniform",
                    pareto_a: float = 0.25) -> torch.Tensor:
    """The fixed table [num_embeddings, multi_hot_size] int32 with entries in [0, num_embeddings)."""
    rs = np.random.RandomState(seed)
    n, m = int(num_embeddings), int(multi_hot_size)
    if distribution == "uniform":
        t = rs.randint(0, n, size=(n, m)).astype(np.int64)
    elif distribution == "pareto":
        t = np.floor(np.minimum(rs.pareto(a=pareto_a, size=(n, m)), _PARETO_CLIP)).astype(np.int64) % n
    else:
        raise DataError(f"multi-hot distribution {distribution!r} is not one of {DISTRIBUTIONS}")
    dtype = np.int32 if n <= np.iinfo(np.int32).max else np.int64
    return torch.from_numpy(t.astype(dtype))


def _sizes(multi_hot_size: int | Sequence[int], n_features: int) -> tuple[int | list[int], list[int]]:
    """(the option as given, normalised; m_i per feature); a DataError names a wrong size or count."""
    if isinstance(multi_hot_size, (int, np.integer)):
        if int(multi_hot_size) < 1:
            raise DataError(f"multi_hot_size must be >= 1, got {multi_hot_size}")
        return int(multi_hot_size), [int(multi_hot_size)] * n_features
    sizes = [int(m) for m in multi_hot_size]
    if len(sizes) != n_features:
        raise DataError(f"multi_hot_size lists {len(sizes)} sizes but there are {n_features} sparse features; give one "
                        "size per sparse feature in schema order (or one number for all)")
    if bad := [m for m in sizes if m < 1]:
        raise DataError(f"multi_hot_size entries must be >= 1, got {bad} in {sizes}")
    return sizes, sizes


class MultiHot:
    """Expand single-valued sparse features into ``multi_hot_size`` ids each (see module docstring).

    Features are matched to the KeyedJagged's keys by position: key i uses ``num_embeddings[i]``;
    keys past ``len(num_embeddings)`` (e.g. sequence features) are passed through unchanged, and so are
    keys whose ``single_valued[i]`` is False (multi-valued features already hold several ids).
    """

    def __init__(
        self,
        num_embeddings: Sequence[int],
        multi_hot_size: int | Sequence[int],
        multi_hot_min_table_size: int,
        distribution: str = "uniform",
        collect_freqs: bool = False,
        pareto_a: float = 0.25,
        single_valued: Sequence[bool] | None = None,
    ) -> None:
        if distribution not in DISTRIBUTIONS:
            raise DataError(f"multi-hot distribution {distribution!r} is not one of {DISTRIBUTIONS}")
        self.num_embeddings = [int(n) for n in num_embeddings]
        if any(n < 1 for n in self.num_embeddings):
            raise DataError(f"num_embeddings must all be >= 1, got {self.num_embeddings}")
        self.multi_hot_size, self.sizes = _sizes(multi_hot_size, len(self.num_embeddings))
        self.multi_hot_min_table_size = int(multi_hot_min_table_size)
        self.distribution = distribution
        self.pareto_a = float(pareto_a)
        single = list(single_valued) if single_valued is not None else [True] * len(self.num_embeddings)
        if len(single) != len(self.num_embeddings):
            raise DataError(f"single_valued needs one flag per feature ({len(self.num_embeddings)}), got {len(single)}")
        self.expanded = [n >= self.multi_hot_min_table_size and one for n, one in zip(self.num_embeddings, single)]
        # fixed lookup tables, never trained: weight[i] is None for features left single-valued
        self.weight: list[torch.Tensor | None] = [
            multi_hot_table(n, m, i, distribution, pareto_a) if e else None
            for i, (n, m, e) in enumerate(zip(self.num_embeddings, self.sizes, self.expanded))
        ]
        self.collect_freqs = collect_freqs
        self.freqs_pre: list[torch.Tensor] = []
        self.freqs_post: list[torch.Tensor] = []
        if collect_freqs:
            self.freqs_pre = [torch.zeros(n, dtype=torch.int64) for n in self.num_embeddings]
            self.freqs_post = [torch.zeros(n, dtype=torch.int64) for n in self.num_embeddings]

    @classmethod
    def from_schema(cls, schema: Schema, multi_hot_size: int | Sequence[int], multi_hot_min_table_size: int,
                    distribution: str = "uniform", collect_freqs: bool = False, pareto_a: float = 0.25) -> MultiHot:
        """One entry per sparse feature of ``schema`` (in order): the rows of the table it uses; only its
        single-valued features are expanded."""
        tables = schema.tables()
        n = [tables[s.table_name].num_embeddings for s in schema.sparse]
        return cls(n, multi_hot_size, multi_hot_min_table_size, distribution, collect_freqs, pareto_a,
                   single_valued=[not s.multi_valued for s in schema.sparse])

    def fingerprint(self) -> str:
        """sha256 of the options and every fixed table: equal fingerprints, equal expansion."""
        h = hashlib.sha256(repr((self.num_embeddings, self.multi_hot_size, self.multi_hot_min_table_size,
                                 self.distribution, self.pareto_a)).encode())
        for t in self.weight:
            h.update(b"-" if t is None else t.numpy().astype("<i8").tobytes())
        return "sha256:" + h.hexdigest()

    def __call__(self, kj: KeyedJagged) -> KeyedJagged:
        """Expanded copy of ``kj`` (B = kj.stride). Expanded keys must have exactly one id per row."""
        B = kj.stride
        nkeys = len(kj.keys)
        if nkeys < len(self.num_embeddings):
            raise DataError(
                f"MultiHot was built for {len(self.num_embeddings)} features but the batch has {nkeys} keys "
                f"{kj.keys}; build it from the same schema / key list"
            )
        if not any(self.expanded) and not self.collect_freqs:
            return kj
        opk = kj.offset_per_key()
        L = kj.lengths_2d()  # (F, B)
        new_lengths = L.clone()
        values: list[torch.Tensor] = []
        weights: list[torch.Tensor] | None = [] if kj.weights is not None else None
        for i in range(nkeys):
            v = kj.values[opk[i] : opk[i + 1]]
            w = kj.weights[opk[i] : opk[i + 1]] if kj.weights is not None else None
            table = self.weight[i] if i < len(self.weight) else None
            if table is None:
                out_v, out_w = v, w
            else:
                if v.numel() != B:
                    raise DataError(
                        f"MultiHot expands single-valued features only, but key {kj.keys[i]!r} has "
                        f"{v.numel()} ids for {B} rows; mark it multi_valued or raise multi_hot_min_table_size"
                    )
                if B and (int(v.min()) < 0 or int(v.max()) >= table.shape[0]):
                    raise DataError(
                        f"key {kj.keys[i]!r} has ids outside [0, {table.shape[0]}); MultiHot's num_embeddings "
                        "must match the vocabulary the ids were encoded with"
                    )
                m = table.shape[1]  # m_i
                mh = table[v].to(torch.int64)  # (B, m) == F.embedding(v, weight[i])
                mh[:, 0] = v  # keep the original id first
                out_v = mh.reshape(-1)  # row-major: row b's m ids are contiguous
                out_w = w.repeat_interleave(m) if w is not None else None
                new_lengths[i] = m
            if self.collect_freqs and i < len(self.num_embeddings):
                n = self.num_embeddings[i]
                self.freqs_pre[i] += torch.bincount(v, minlength=n)[:n]
                self.freqs_post[i] += torch.bincount(out_v, minlength=n)[:n]
            values.append(out_v)
            if weights is not None:
                weights.append(out_w)
        return KeyedJagged(
            kj.keys,
            torch.cat(values) if values else kj.values,
            lengths=new_lengths.reshape(-1),
            stride=B,
            weights=torch.cat(weights) if weights else None,
        )

    def offsets(self, batch_size: int) -> torch.Tensor:
        """The seed's ``offset_n`` for an all-single-valued batch of ``batch_size`` rows:
        [0, cumsum(lso)] with lso = 1 per (key, row), m_i for expanded keys. Shape [F * B + 1]."""
        m = torch.tensor([s if e else 1 for s, e in zip(self.sizes, self.expanded)], dtype=torch.int64)
        lso = m[:, None].expand(len(self.num_embeddings), batch_size)
        return torch.cat([torch.zeros(1, dtype=torch.int64), lso.reshape(-1).cumsum(0)])

    def save_freqs(self, path: str | Path) -> Path:
        """Write per-feature id counts before / after expansion to ``path`` (.npz: pre_i, post_i)."""
        if not self.collect_freqs:
            raise RuntimeError("MultiHot was built with collect_freqs=False; there are no statistics to save")
        path = Path(path)
        arrays = {f"pre_{i}": t.numpy() for i, t in enumerate(self.freqs_pre)}
        arrays.update({f"post_{i}": t.numpy() for i, t in enumerate(self.freqs_post)})
        with open(path, "wb") as f:
            np.savez(f, **arrays)
        return path

    def __repr__(self) -> str:
        return (f"MultiHot(multi_hot_size={self.multi_hot_size}, min_table_size={self.multi_hot_min_table_size}, "
                f"distribution={self.distribution!r}, expanded={sum(self.expanded)}/{len(self.expanded)})")
