"""Run picklable task functions in this process, a local process pool or a Dask cluster; results in task order.

Why Dask distributed (``ctrkit[cluster]``) and not Ray: the tasks are plain functions over files with small
results, which is exactly ``Client.submit``; Dask runs on a shared file system from an address
(``dask scheduler`` / ``dask worker ADDRESS`` on each machine, or a batch system through dask-jobqueue), is a
pure-Python install next to numpy / pyarrow, and needs no object store or runtime of its own. Ray would bring
its own object store and a far larger install for the same submit / result pattern.

Results come back in the order the calls were given, whatever order the workers finish in, with at most
``window`` calls in flight, so the caller can merge them in (day, block) order while memory stays bounded.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any

from ctrkit.errors import ConfigError

log = logging.getLogger(__name__)
CONNECT_TIMEOUT = "30s"  # how long to wait for the Dask scheduler


class TaskRunner:
    """``workers`` processes of a local pool ("spawn" start method: safe beside CUDA and threads), or the Dask
    cluster at ``scheduler`` (an address such as ``tcp://host:8786``); one worker runs the tasks in this process."""

    def __init__(self, workers: int = 1, scheduler: str | None = None) -> None:
        if workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {workers}")
        self.workers, self.scheduler = workers, scheduler
        self._pool: Executor | None = None
        self._client: Any = None

    def __enter__(self) -> TaskRunner:  # noqa: PYI034
        if self.scheduler is not None:
            try:
                from distributed import Client
            except ImportError:
                raise ConfigError("--scheduler needs Dask distributed: pip install 'ctrkit[cluster]' (dask, "
                                  "distributed) here and on every worker") from None
            try:
                self._client = Client(self.scheduler, timeout=CONNECT_TIMEOUT)
            except OSError as e:
                raise ConfigError(f"--scheduler {self.scheduler}: cannot reach the Dask scheduler ({e}); start "
                                  "it with `dask scheduler` and pass its address") from None
            self.workers = max(1, len(self._client.scheduler_info().get("workers", {})))
            log.info("dask: %d workers at %s", self.workers, self.scheduler)
        elif self.workers > 1:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._client is not None:
            self._client.close()

    def ordered(self, fn: Callable[..., Any], calls: Iterable[tuple[Any, ...]]) -> Iterator[Any]:
        """``fn(*args)`` for every ``args`` of ``calls``, yielded in the order of ``calls``."""
        if self._pool is None and self._client is None:
            yield from (fn(*args) for args in calls)
            return
        window, pending = 2 * self.workers, deque()  # type: ignore[var-annotated]
        todo = iter(calls)
        try:
            for args in todo:
                pending.append(self._submit(fn, args))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:  # an error or an early stop: do not leave work running
                f.cancel()

    def _submit(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        if self._client is not None:
            return self._client.submit(fn, *args, pure=False)
        return self._pool.submit(fn, *args)  # type: ignore[union-attr]
