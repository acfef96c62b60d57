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
from collections.abc import Iterator
from typing import Any

from ctrkit.background import background
from ctrkit.batch import Batch
from ctrkit.data.pipeline.id_dropout import IdDropout

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


class RoundLoader:
    """What every loader of rank shares has in common: batches per epoch, the epoch plan's position (epoch, rounds
    consumed), the prefetching iteration over this rank's shares, and the exact resume, at another world size when
    the global batch is the same. A loader sets the attributes below and defines :meth:`_epoch_batches`."""

    batch_size: int
    rank: int
    world_size: int
    drop_last: bool
    even_tail: bool
    num_rows: int
    prefetch: int
    epoch: int
    batches_yielded: int
    _resume_from: int
    id_dropout: IdDropout | None = None  # training loaders: ids dropped to the rare id (train.id_dropout)
    _prefetch_thread = "ctrkit-batch-prefetch"

    def __len__(self) -> int:
        """Batches per epoch (of this rank: the rounds with a batch for it)."""
        return len(self._shares(warn=False))

    def _shares(self, warn: bool = True) -> list[tuple[int, int]]:
        """This rank's (first, end) positions in the epoch order, one per batch it reads (module docstring)."""
        return rank_shares(self.num_rows, self.batch_size, rank=self.rank, world_size=self.world_size,
                           drop_last=self.drop_last, even_tail=self.even_tail, warn=warn)

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` from its start (a resume position loaded earlier is dropped)."""
        self.epoch, self.batches_yielded, self._resume_from = int(epoch), 0, 0

    def _epoch_batches(self, epoch: int, start: int) -> Iterator[Batch]:
        """The batches of this rank's shares of ``epoch`` from share ``start`` on."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[Batch]:
        epoch, start = self.epoch, self._resume_from
        self._resume_from = 0
        self.batches_yielded = start
        batches = self._epoch_batches(epoch, start)
        if self.id_dropout:
            batches = self.id_dropout.apply(batches, epoch, start, self.rank)
        source = background(batches, self.prefetch, self._prefetch_thread) if self.prefetch > 0 else batches
        try:
            for batch in source:
                self.batches_yielded += 1
                yield batch
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()
        if self.epoch == epoch and self.batches_yielded == len(self):
            self.epoch, self.batches_yielded = epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def _resume(self, state: dict[str, Any], keys: tuple[str, ...], *, strict: bool, what: str, fix: str) -> None:
        """Load the position of ``state``: its ``keys`` must equal this loader's (``strict``: and be present; a
        mismatch names ``what`` and its fix); a state saved at another world size resumes when the global batch is
        the same. The next iteration yields batches ``batches_yielded`` .. ``len - 1`` of ``epoch``."""
        mine = self.state_dict()
        world = int(state.get("world_size", 1))
        if world != self.world_size and "batch_size" in state:  # the same global batch resumes at another size
            if int(state["batch_size"]) * world != self.batch_size * self.world_size or not self.even_tail:
                raise ValueError(
                    f"loader state was saved by {world} process(es) with batch_size={state['batch_size']} each; this "
                    f"loader has {self.world_size} x {self.batch_size}: resume with the same global batch "
                    f"({int(state['batch_size']) * world} rows) to resume exactly")
            state = {**state, "batch_size": self.batch_size}
        for key in keys:
            if (strict and key not in state) or (key in state and state[key] != mine[key]):
                raise ValueError(f"loader state has {key}={state.get(key)!r} but this {what} has {key}={mine[key]!r}; "
                                 f"{fix}")
        done = int(state["batches_yielded"])
        if not 0 <= done <= len(self):
            raise ValueError(f"loader state batches_yielded={done} is outside [0, {len(self)}]")
        self.epoch, self.batches_yielded, self._resume_from = int(state["epoch"]), done, done
