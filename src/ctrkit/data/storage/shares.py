"""Which rows of an epoch one data-parallel rank reads (DESIGN §8): the one rule of the loaders.

An epoch order of ``n`` rows (positions 0 .. n-1, however a loader orders its rows) is cut into batches of
``batch_size`` rows; batch i goes to rank i mod ``world_size``, so a round of ``world_size`` batches is one global
batch of ``world_size x batch_size`` rows, the rows one process reads with that batch size. With ``even_tail``
(training) every rank steps equally often: the rows of the last, incomplete round are split evenly over the ranks
(fewer rows than ranks: dropped, with a warning; ``drop_last``: the round is dropped). Without it (evaluation)
batch i stays on rank i mod ``world_size`` to the end, so a rank may get one batch fewer.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def rank_shares(n: int, batch_size: int, *, rank: int = 0, world_size: int = 1, drop_last: bool = False,
                even_tail: bool = True, warn: bool = True) -> list[tuple[int, int]]:
    """This rank's batches of an epoch of ``n`` rows as (first, end) positions in the epoch order."""
    B, W = int(batch_size), int(world_size)
    if not 0 <= rank < W:
        raise ValueError(f"rank must be in [0, world_size={W}), got {rank}")
    nb = n // B if drop_last else -(-n // B)  # one process's batches
    if W == 1 or not even_tail:
        return [(i * B, min((i + 1) * B, n)) for i in range(rank, nb, W)]
    full, rest = divmod(n, W * B)
    out = [((i * W + rank) * B, (i * W + rank + 1) * B) for i in range(full)]
    if rest and not drop_last:
        if rest < W:
            if warn and rank == 0:
                log.warning("%d rows of the last global batch are not read this epoch: fewer rows than the %d ranks",
                            rest, W)
        else:
            a = full * W * B
            out.append((a + rest * rank // W, a + rest * (rank + 1) // W))
    return out
