"""One way to run an iterator ahead of its consumer in a daemon thread: reading and gunzipping day files,
parsing Criteo blocks, building the next batches (numpy, zlib and file reads release the GIL).

:func:`background` keeps at most ``depth`` items ready, re-raises the worker's exception in the consumer, and
when the consumer stops (exhausted, ``break``, an error, ``close()``) it stops the worker, closes the source
and joins the thread, so no worker outlives the loop that used it. Every live worker is also known here:
:func:`stop_all` stops and joins them all, and runs at interpreter exit (and at the end of every CLI command),
for a consumer that was dropped without being closed. Why it matters: a thread still running when the
interpreter finalizes is made to exit as soon as it asks for the GIL, and if it asks from inside native code
(torch, Arrow) the process ends with "terminate called without an active exception" (exit 134) instead of the
clean exit after an error.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

JOIN_SECONDS = 10.0  # the longest a consumer waits for its worker to finish the item in hand

_LIVE: dict[threading.Thread, threading.Event] = {}  # every started worker -> its stop flag, until joined
_LIVE_LOCK = threading.Lock()


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
    with _LIVE_LOCK:
        for dead in [t for t in _LIVE if t.ident is not None and not t.is_alive()]:  # dropped, never closed
            del _LIVE[dead]
        _LIVE[thread] = stop
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
        _stop_and_join(thread, stop, JOIN_SECONDS)


def _stop_and_join(thread: threading.Thread, stop: threading.Event, timeout: float) -> bool:
    """Stop one worker and wait up to ``timeout`` seconds for it; True when it has ended."""
    stop.set()
    if thread is not threading.current_thread():
        thread.join(timeout=timeout)
    if thread.is_alive():
        log.warning("background thread %s did not stop within %.0f s", thread.name, timeout)
        return False
    with _LIVE_LOCK:
        _LIVE.pop(thread, None)
    return True


def live_workers() -> list[threading.Thread]:
    """The workers started by :func:`background` that have not been joined yet."""
    with _LIVE_LOCK:
        return list(_LIVE)


def stop_all(timeout: float = JOIN_SECONDS) -> int:
    """Stop every live worker (each ends at its next item) and join it; the number still running after
    ``timeout`` seconds each (0 when all ended)."""
    with _LIVE_LOCK:
        workers = list(_LIVE.items())
    for _, stop in workers:
        stop.set()
    return sum(not _stop_and_join(t, s, timeout) for t, s in workers)


atexit.register(stop_all)  # atexit runs before finalization makes daemon threads exit
