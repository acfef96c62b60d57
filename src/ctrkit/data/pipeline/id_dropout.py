"""Id dropout (``train.id_dropout: {user_id: 0.1}``): while training, each id of the named sparse keys is replaced
by id 1 -- the rare / unseen id every vocabulary gives a value it does not hold -- with the key's probability.

Why: with ``min_freq`` 1 no training row carries id 1, so its embedding row keeps its random start, and that
untrained row is what a model scores every value it has never seen with (a new user, a new item). Where most
rows to score come from values the vocabulary does not hold yet (MovieLens users rate in bursts: most of next
week's ratings come from users the training data never saw), dropping a share of the known ids to 1 trains that
row as the representation of an unknown value and makes the model lean on the other features (the user's
attributes and history) for them: the cold-start training of DropoutNet (Volkovs et al., NeurIPS 2017), applied
to ids. Missing values (id 0) and ids already 1 are left as they are; validation, test and serving rows are
never touched (only the training loader applies it).

Which ids drop is a function of (``seed``, epoch, batch position, rank) only, so a resumed run draws the same ones; a
draw is one ``torch.rand`` over the batch's ids of the keys named (no per-row Python). With a hashed vocabulary
(``max_vocab`` mode ``hash``) id 1 is a bucket that known values share too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.errors import ConfigError
from ctrkit.typecheck import suggest

RARE = 1  # the id of values a vocabulary does not hold (vocab.py)


class IdDropout:
    """``rates`` {sparse key: probability in [0, 1)} applied to training batches (module docstring)."""

    def __init__(self, rates: Mapping[str, float], keys: Sequence[str], seed: int = 0,
                 what: str = "train.id_dropout") -> None:
        for k, p in rates.items():
            if k not in keys:
                raise ConfigError(f"{what}: {k!r} is not a sparse key of the training store{suggest(k, list(keys))}")
            if not 0.0 <= float(p) < 1.0:
                raise ConfigError(f"{what}.{k}={p!r}: a probability in [0, 1) is needed (0.1 drops one id in ten "
                                  "to the rare id 1)")
        self.rates = {k: float(p) for k, p in rates.items() if float(p) > 0}
        self.seed = int(seed)

    def __bool__(self) -> bool:
        return bool(self.rates)

    def generator(self, epoch: int, position: int, rank: int = 0) -> torch.Generator:
        """The draw of batch ``position`` of ``epoch`` (of process ``rank``): a generator seeded by (seed, epoch,
        position, rank)."""
        s = np.random.SeedSequence([self.seed, int(epoch), int(position), int(rank)]).generate_state(1, np.uint64)[0]
        return torch.Generator().manual_seed(int(s) & ((1 << 63) - 1))

    def __call__(self, batch: Batch, epoch: int, position: int, rank: int = 0) -> Batch:
        """``batch`` with the ids of the keys in ``rates`` dropped to 1 (a new ``values`` tensor; ``batch`` as is)."""
        kj = batch.sparse
        rate = torch.zeros(len(kj.keys))
        for k, p in self.rates.items():
            if k in kj.keys:
                rate[kj.keys.index(k)] = p
        per_key = torch.as_tensor(kj.length_per_key(), dtype=torch.int64)
        p_of_id = torch.repeat_interleave(rate, per_key)  # (N,) the probability of each id, by its key
        u = torch.rand(p_of_id.shape, generator=self.generator(epoch, position, rank))
        drop = (u < p_of_id).to(kj.values.device) & (kj.values > RARE)
        values = torch.where(drop, torch.full_like(kj.values, RARE), kj.values)
        sparse = KeyedJagged(kj.keys, values, lengths=kj.lengths, offsets=kj.offsets, stride=kj.stride,
                             weights=kj.weights)
        return dataclasses.replace(batch, sparse=sparse)

    def apply(self, batches: Iterator[Batch], epoch: int, start: int, rank: int = 0) -> Iterator[Batch]:
        """The batches of ``epoch`` (of process ``rank``) from position ``start`` on, each with its ids dropped."""
        for i, batch in enumerate(batches, start):
            yield self(batch, epoch, i, rank)
