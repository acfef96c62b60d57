"""One way to run an iterator ahead of its consumer in a daemon thread: reading and gunzipping day files,
parsing Criteo blocks, building the next batches (numpy, zlib and file reads release the GIL).

:func:`background` keeps at most ``depth`` items ready, re-raises the worker's exception in the consumer, and
when the consumer stops (exhausted, ``break``, an error, ``close()``) it stops the worker, closes the source
and joins the thread, so no worker outlives the loop that used it (a thread still running at interpreter exit
can end the process with a native abort instead of the clean exit after an error).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

JOIN_SECONDS = 10.0  # the longest a consumer waits for its worker to finish the item in hand


class _Failure:
    """An exception raised in the worker, carried to the consumer."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_END = object()


def background(source: Iterable[T], depth: int = 2, name: str = "ctrkit-background") -> Iterator[T]:
    """Yield the items of ``source``, produced ``depth`` ahead in a daemon thread named ``name``."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        it = iter(source)
        try:
            for item in it:
                if not put(item):
                    return
            put(_END)
        except BaseException as e:  # noqa: BLE001 - carried to the consumer
            put(_Failure(e))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()  # a generator source (or a chain of them) releases its files and threads now

    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        stop.set()
        thread.join(timeout=JOIN_SECONDS)
