"""The micro-batcher's wait: a batch that waits for more requests closes as soon as the queue holds the rows
it lacks, and otherwise after ``max_wait_s``; requests that arrive while it waits join it."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from ctrkit.serving.batching import MicroBatcher


def _batcher(calls: list[int], max_wait_s: float, max_rows: int) -> MicroBatcher:
    def score_fn(columns, n):
        calls.append(n)
        return np.asarray(columns["v"], np.float32), [], None

    return MicroBatcher(score_fn, max_wait_s=max_wait_s, max_rows=max_rows)


def test_a_waiting_batch_closes_once_the_queue_holds_its_rows():
    calls: list[int] = []

    async def run() -> tuple[list, float]:
        batcher = _batcher(calls, max_wait_s=5.0, max_rows=10)
        batcher.start()
        first = [asyncio.create_task(batcher.score({"v": [k]}, 1)) for k in range(2)]  # queued together: waits
        await asyncio.sleep(0.05)
        t = time.perf_counter()
        later = [asyncio.create_task(batcher.score({"v": list(range(10 + 4 * k, 14 + 4 * k))}, 4)) for k in range(3)]
        out = await asyncio.gather(*first, *later)
        took = time.perf_counter() - t
        await batcher.stop()
        return out, took

    out, took = asyncio.run(run())
    assert took < 2.0  # closed when 2 + 4 + 4 rows were there, not after the 5 s wait
    assert calls == [10, 4]  # the batch took rows up to max_rows; the last request went to the next call
    assert [o.scores.tolist() for o in out] == [[0], [1], list(range(10, 14)), list(range(14, 18)),
                                                list(range(18, 22))]


def test_a_waiting_batch_closes_after_max_wait_with_what_arrived():
    calls: list[int] = []

    async def run() -> float:
        batcher = _batcher(calls, max_wait_s=0.2, max_rows=1000)
        batcher.start()
        t = time.perf_counter()
        first = [asyncio.create_task(batcher.score({"v": [k]}, 1)) for k in range(2)]
        await asyncio.sleep(0.05)
        late = asyncio.create_task(batcher.score({"v": [7, 8]}, 2))  # arrives during the wait: joins the batch
        await asyncio.gather(*first, late)
        took = time.perf_counter() - t
        await batcher.stop()
        return took

    took = asyncio.run(run())
    assert calls == [4] and 0.15 < took < 3.0
