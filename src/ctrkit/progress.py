"""Progress of a long loop: a tqdm bar on a terminal (or in a notebook), periodic log lines anywhere else.

A bar redraws itself with carriage returns, which in a log file or a pipe (CI, ``nohup``, ``| tee``) become
one unreadable line of thousands of frames. ``progress_bar`` returns tqdm only where stderr is a terminal and
otherwise a ``LogProgress``: the same ``update`` / ``set_postfix`` / ``close`` calls, written as one log line
(logger ``ctrkit.progress``, INFO) every ``interval_s`` seconds and one when the loop ends.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

from tqdm import tqdm as plain_tqdm
from tqdm.auto import tqdm as auto_tqdm
from tqdm.autonotebook import tqdm as notebook_or_plain_tqdm

log = logging.getLogger("ctrkit.progress")

INTERVAL_S = 30.0  # seconds between two log lines of a LogProgress


def _format(x: float, unit_scale: bool, suffix: str = "", digits: str = ".0f") -> str:
    """1234567 -> "1.23M" + suffix with ``unit_scale`` (tqdm's SI prefixes), else as ``digits``."""
    return plain_tqdm.format_sizeof(x, suffix) if unit_scale else f"{x:{digits}}"


class LogProgress:
    """tqdm's ``update`` / ``set_postfix`` / ``close`` as log lines:
    ``train: 1200/5000 (24%), 35.2 it/s, loss=0.4531`` at most every ``interval_s`` seconds, and at ``close``."""

    def __init__(self, total: float | None, *, desc: str = "", initial: float = 0, unit: str = "it",
                 unit_scale: bool = False, interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.n, self.desc = total, initial, desc
        self.unit, self.unit_scale, self.interval_s = unit, unit_scale, interval_s
        self.postfix: dict[str, Any] = {}
        self._clock = clock
        self._start = self._last = clock()
        self._start_n = initial
        self._closed = False

    def update(self, n: float = 1) -> None:
        self.n += n
        now = self._clock()
        if now - self._last >= self.interval_s:
            self._last = now
            log.info("%s", self.line(now))

    def set_postfix(self, ordered_dict: Mapping[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        self.postfix = {**(ordered_dict or {}), **kwargs}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            log.info("%s", self.line(self._clock(), done=True))

    def line(self, now: float, done: bool = False) -> str:
        """The text of one log line at clock time ``now``."""
        seconds = now - self._start
        unit = self.unit if self.unit_scale else ""
        count = _format(self.n, self.unit_scale, unit)
        if self.total:
            count += f"/{_format(self.total, self.unit_scale, unit)} ({100 * self.n / self.total:.0f}%)"
        parts = [f"{self.desc}: {count}" if self.desc else count]
        if seconds > 0:
            parts.append(f"{_format((self.n - self._start_n) / seconds, self.unit_scale, digits='.3g')}{self.unit}/s")
        if done:
            parts.append(f"done in {seconds:.1f}s")
        parts += [f"{k}={v}" for k, v in self.postfix.items()]
        return ", ".join(parts)


def progress_bar(total: float | None, *, desc: str, enabled: bool | None = True, initial: float = 0,
                 unit: str = "it", unit_scale: bool = False, file: IO[str] | None = None,
                 **tqdm_options: Any) -> Any:
    """A progress object for a loop of ``total`` steps (or bytes, with ``unit="B", unit_scale=True``).

    ``enabled``: True shows progress (a bar on a terminal, log lines elsewhere), False nothing, None a bar on
    a terminal and nothing elsewhere (tqdm's ``disable=None``). ``tqdm_options`` go to the bar only."""
    stream = file if file is not None else sys.stderr
    notebook = notebook_or_plain_tqdm is not plain_tqdm  # a notebook widget: no carriage returns there
    terminal = notebook or bool(getattr(stream, "isatty", lambda: False)())
    if enabled is False or (enabled is None and not terminal):
        return plain_tqdm(total=total, initial=initial, disable=True)
    if terminal:
        return auto_tqdm(total=total, initial=initial, desc=desc, unit=unit, unit_scale=unit_scale, file=file,
                         **tqdm_options)
    return LogProgress(total, desc=desc, initial=initial, unit=unit, unit_scale=unit_scale)
