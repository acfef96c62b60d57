"""Micro-batching for ``ctrkit serve``: concurrent requests scored in one model call.

Requests put their validated rows (canonical columns, :mod:`ctrkit.serving.validation`) on a queue and await
a future. One background task takes them off in arrival order and scores each micro-batch in a worker thread
(so the event loop keeps reading and parsing requests meanwhile), then gives every request its own slice of
the scores. The policy:

* a request that finds the queue idle is scored at once: a lone client pays no batching delay;
* while a batch is being scored, new requests queue up; the next batch takes all of them (in order), up to
  ``max_rows`` rows: batches grow with the load by themselves;
* when more than one request is waiting, the batch also waits up to ``max_wait_s`` for more to arrive, and
  closes as soon as the queue holds the rows it lacks to reach ``max_rows`` (so a batch exceeds ``max_rows``
  by at most one request's rows); the wait is one timer per batch, not one per arriving request.

Rows are encoded independently (:meth:`Predictor.score`), so a row's score does not depend on the batch it
was merged into, and a malformed row (reported by the scorer with its row number) is returned to the request
that sent it only. If the merged call fails, every request of the batch is retried alone, so one request's
failure never fails the others.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from ctrkit.errors import Problem

log = logging.getLogger(__name__)

Columns = dict[str, Any]  # column -> its n values: a list or a numpy array
# columns of n rows -> (scores [n], the (1-based row, field, reason) of the rows it could not score, what scored
# them: given back to every request of the call, e.g. the version of the model)
ScoreFn = Callable[[Columns, int], tuple[np.ndarray, list[Problem], Any]]


@dataclass
class Scores:
    """One request's result: ``scores`` [n], the problems of its malformed rows (0-based rows) and the
    ``source`` the score function named for the call that scored them."""

    scores: np.ndarray
    bad: list[Problem] = field(default_factory=list)
    source: Any = None


@dataclass
class _Job:
    columns: Columns
    n: int
    future: asyncio.Future


@dataclass
class BatchStats:
    """Counters since start: requests scored, model calls (batches) and rows."""

    requests: int = 0
    batches: int = 0
    rows: int = 0
    largest_batch_rows: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "batches": self.batches, "rows": self.rows,
                "largest_batch_rows": self.largest_batch_rows,
                "mean_requests_per_batch": round(self.requests / self.batches, 3) if self.batches else None}


class MicroBatcher:
    """Merge concurrent :meth:`score` calls into calls of ``score_fn`` (see the module docstring)."""

    def __init__(self, score_fn: ScoreFn, *, max_wait_s: float = 0.002, max_rows: int = 4096) -> None:
        self.score_fn = score_fn
        self.max_wait_s = float(max_wait_s)
        self.max_rows = int(max_rows)
        self.stats = BatchStats()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctrkit-score")
        self._queue: asyncio.Queue[_Job] | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queued_rows = 0  # rows on the queue
        self._need = 0  # rows the batch waiting for more still takes (0: none is waiting)
        self._enough: asyncio.Event | None = None  # set when the queue holds them

    # ---- life cycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the batching task on the running event loop (again, if it ran on another loop before)."""
        loop = asyncio.get_running_loop()
        if self._task is not None and not self._task.done() and self._loop is loop:
            return
        self._loop, self._queue, self._enough = loop, asyncio.Queue(), asyncio.Event()
        self._queued_rows = self._need = 0
        self._task = loop.create_task(self._run(self._queue), name="ctrkit-micro-batcher")

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        """Cancel the batching task; requests still queued get a cancelled future."""
        task, queue = self._task, self._queue
        self._task = self._queue = None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        while queue is not None and not queue.empty():
            queue.get_nowait().future.cancel()

    # ---- scoring -------------------------------------------------------------------------------------
    async def score(self, columns: Columns, n: int) -> Scores:
        """Scores of ``n`` rows given as canonical ``columns``, scored with other requests' rows."""
        if self._loop is not asyncio.get_running_loop() or not self.running:
            self.start()
        assert self._queue is not None
        job = _Job(columns, n, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(job)
        self._queued_rows += n
        if self._need and self._queued_rows >= self._need and self._enough is not None:
            self._enough.set()  # the waiting batch can close
        return await job.future

    async def _run(self, queue: asyncio.Queue[_Job]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = [await queue.get()]
            self._queued_rows -= jobs[0].n
            rows = self._take(queue, jobs, jobs[0].n)  # whatever arrived while the last batch ran
            if len(jobs) > 1 and self.max_wait_s > 0:  # under load: give the next requests a moment to arrive
                deadline = time.monotonic() + self.max_wait_s
                if rows < self.max_rows and (left := deadline - time.monotonic()) > 0:
                    await self._wait_for_rows(self.max_rows - rows, left)
                    rows = self._take(queue, jobs, rows)
            jobs = [j for j in jobs if not j.future.done()]  # a cancelled request (client gone) is not scored
            if not jobs:
                continue
            try:
                results = await loop.run_in_executor(self._executor, self._score_jobs, jobs)
            except Exception as e:  # the loop must outlive any one batch
                log.exception("micro-batch failed outside the scorer")
                results = [e] * len(jobs)
            for job, res in zip(jobs, results):
                if job.future.done():
                    continue
                if isinstance(res, BaseException):
                    job.future.set_exception(res)
                else:
                    job.future.set_result(res)

    def _take(self, queue: asyncio.Queue[_Job], jobs: list[_Job], rows: int) -> int:
        """Move queued jobs onto ``jobs`` while the batch holds fewer than ``max_rows`` rows; its rows after."""
        while rows < self.max_rows and not queue.empty():
            jobs.append(queue.get_nowait())
            rows += jobs[-1].n
            self._queued_rows -= jobs[-1].n
        return rows

    async def _wait_for_rows(self, need: int, timeout: float) -> None:
        """Until the queue holds ``need`` rows (:meth:`score` signals it) or ``timeout`` seconds pass: one
        timer per batch, not one per arriving request."""
        if self._queued_rows >= need or self._enough is None:
            return
        self._need = need
        self._enough.clear()
        try:
            await asyncio.wait_for(self._enough.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            self._need = 0

    def _score_jobs(self, jobs: list[_Job]) -> list[Scores | BaseException]:
        """(worker thread) One call for all ``jobs``, split back per job; each job alone if that call fails."""
        n = sum(j.n for j in jobs)
        try:
            if len(jobs) == 1:
                merged = jobs[0].columns
            else:
                merged = {c: _concat([j.columns[c] for j in jobs]) for c in jobs[0].columns}
            scores, bad, source = self.score_fn(merged, n)
        except Exception as e:  # noqa: BLE001 - handed to the request (one alone) or retried per request
            if len(jobs) == 1:
                self._count(jobs)
                return [e]
            log.warning("a micro-batch of %d requests failed (%s); scoring them one by one", len(jobs), e)
            return [r for j in jobs for r in self._score_jobs([j])]
        self._count(jobs)
        starts = np.cumsum([0] + [j.n for j in jobs]).tolist()
        per_job: list[list[Problem]] = [[] for _ in jobs]
        for p in bad:
            k = bisect.bisect_right(starts, p.row - 1) - 1
            per_job[k].append(Problem(p.row - 1 - starts[k], p.field, p.reason))
        return [Scores(scores[starts[k]:starts[k + 1]], per_job[k], source) for k in range(len(jobs))]

    def _count(self, jobs: list[_Job]) -> None:
        rows = sum(j.n for j in jobs)
        s = self.stats
        s.requests += len(jobs)
        s.batches += 1
        s.rows += rows
        s.largest_batch_rows = max(s.largest_batch_rows, rows)


def _concat(parts: list[Any]) -> Any:
    """The values of several requests' columns, one after another (numpy arrays stay arrays)."""
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts)
    return list(chain.from_iterable(parts))
