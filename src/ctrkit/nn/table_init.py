"""Initial values of an embedding table as a function of (seed, table name), made in blocks of rows, so that any
part of a table -- a sharded rank's rows and columns -- can be made without the rest (issue 26, sharded tables).

Block ``k`` holds rows ``k * BLOCK_ROWS`` up to ``(k + 1) * BLOCK_ROWS`` (all ``D`` columns) and is drawn from its
own generator, seeded by a hash of (seed, table, k). A table's values therefore do not depend on who makes them: one
process filling the whole table, or each of W ranks filling only the rows / columns of its shards, get the same
numbers, and making a shard needs one block of memory beside the shard, not the table. ``BLOCK_ROWS`` is part of
what the values are: changing it changes every table's initial values.

Distributions, as the fused backend's: "uniform" U(-sqrt(1/rows), sqrt(1/rows)) (torchrec's default), "normal"
N(0, std^2), "zeros".
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from ctrkit.errors import LayerConfigError

BLOCK_ROWS = 1 << 16  # 65,536 rows: 4 MiB per block at D = 16, 32 MiB at D = 128


@dataclass(frozen=True)
class TableInit:
    """How table ``name`` (``rows`` x ``dim``) gets its initial values: ``init`` ("uniform", "normal" with
    ``std``, "zeros") drawn block by block from ``seed`` (module docstring)."""

    seed: int
    name: str
    rows: int
    dim: int
    init: str = "uniform"
    std: float | None = None

    def block_seed(self, k: int) -> int:
        """The generator seed of block ``k``: 63 bits of a hash of (seed, table, k)."""
        digest = hashlib.blake2b(f"{self.seed}:{self.name}:{k}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & ((1 << 63) - 1)

    def block(self, k: int) -> torch.Tensor:
        """Rows ``k * BLOCK_ROWS`` .. of the table -> ``(n, D)``, n = BLOCK_ROWS but for the last block."""
        start = k * BLOCK_ROWS
        out = torch.empty(min(BLOCK_ROWS, self.rows - start), self.dim)
        if self.init == "zeros":
            return out.zero_()
        g = torch.Generator().manual_seed(self.block_seed(k))
        if self.init == "normal":
            return out.normal_(0.0, float(self.std), generator=g)  # type: ignore[arg-type]
        bound = (1.0 / self.rows) ** 0.5
        return out.uniform_(-bound, bound, generator=g)

    @torch.no_grad()
    def fill(self, out: torch.Tensor, row0: int = 0, col0: int = 0) -> torch.Tensor:
        """``out`` ``(r, c)`` (any device) <- rows ``row0 .. row0 + r`` and columns ``col0 .. col0 + c`` of the
        table, one block at a time (the blocks it overlaps only)."""
        r, c = out.shape
        if row0 < 0 or col0 < 0 or row0 + r > self.rows or col0 + c > self.dim:
            raise LayerConfigError(f"table {self.name!r} ({self.rows} x {self.dim}) has no part of shape ({r}, {c}) at "
                             f"row {row0}, column {col0}")
        if self.init == "zeros":
            return out.zero_()
        for k in range(row0 // BLOCK_ROWS, -(-(row0 + r) // BLOCK_ROWS)):
            lo, hi = max(row0, k * BLOCK_ROWS), min(row0 + r, (k + 1) * BLOCK_ROWS)
            block = self.block(k)  # (n, D): generated whole, then sliced, so the values never depend on the slice
            out[lo - row0: hi - row0].copy_(block[lo - k * BLOCK_ROWS: hi - k * BLOCK_ROWS, col0: col0 + c])
        return out
