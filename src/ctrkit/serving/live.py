"""The model a server scores with, and its hot reload: ``ctrkit serve --watch DIR``.

:class:`Served` is one loaded checkpoint, complete and warmed up: its :class:`~ctrkit.serving.predictor.Predictor`,
the request validator of its pipeline and its version (the checkpoint file's sha256). :class:`LiveModel` holds
the one that new work uses; a swap replaces that reference in one assignment, so

* a micro-batch takes the live model once, when it starts, and is scored by that model whole: requests in
  flight finish on the old model, later ones use the new one, and no score ever comes from a model that is
  half loaded (the new one is built, checked and warmed before anyone can see it);
* the old model is freed when the last batch holding it ends.

:class:`Watcher` polls DIR every ``interval`` seconds for its newest checkpoint file (``*.pt``, by modification
time, then name; hidden files such as :meth:`Checkpoint.save`'s temporary ``.x.pt.tmp-PID`` are skipped). When it
is newer than the model served (its file's modification time, or the server's start when that file lies
elsewhere) and (path, size, modification time) was not tried before, it is loaded in a thread, off the event loop: verified
(:meth:`Checkpoint.load`: format, checksum), then its input fields compared with the live model's, which are the
contract clients were given (``/metadata``'s ``input_fields``). A file that fails either is refused, logged
with the reason, and the live model keeps serving; it is tried again only when it changes. With ``--workers N``
every worker runs its own watcher over the same directory, so every worker swaps.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from ctrkit.errors import CheckpointError, ConfigError, CtrkitError, RowErrors
from ctrkit.io import file_checksum
from ctrkit.serving.predictor import Predictor
from ctrkit.serving.validation import RowValidator, render, to_arrays

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """One loaded checkpoint: what scores a micro-batch whole."""

    predictor: Predictor
    validator: RowValidator
    version: str  # sha256 of the checkpoint file
    loaded_at: float = field(default_factory=time.time)

    @classmethod
    def of(cls, predictor: Predictor, version: str | None = None) -> Served:
        """``predictor`` with its request validator; ``version`` defaults to its checkpoint file's sha256."""
        if version is not None:
            predictor.__dict__["checkpoint_sha256"] = version  # the cached property, for Predictor.metadata
        return cls(predictor, RowValidator(predictor.pipeline), str(predictor.checkpoint_sha256))

    @classmethod
    def load(cls, path: str | Path, batch_size: int | None = None) -> Served:
        """The checkpoint at ``path`` verified, loaded and warmed up; refused (CheckpointError) when the file was
        replaced or changed while it was read, so that the version named is the one loaded."""
        path = Path(path)
        before = _identity(path)
        version = file_checksum(path, full=True)
        predictor = Predictor.from_checkpoint(path, batch_size=batch_size)
        if _identity(path) != before:
            raise CheckpointError(f"{path} changed while it was read; it is read again once it stays unchanged")
        served = cls.of(predictor, version)
        served.warm()
        return served

    def warm(self) -> None:
        """Score one row of missing values: loads the code paths and threads before the first request."""
        try:
            checked = self.validator.check([{r.column: None for r in self.validator.rules}])
        except RowErrors as e:
            raise ConfigError(f"{self.checkpoint}: the warm-up row (all values missing) is refused: "
                              f"{render(e.problems[0])}") from None
        self.score(checked.columns, checked.n)

    def score(self, columns: dict[str, Any], n: int) -> np.ndarray:
        """Validated canonical columns of ``n`` rows -> click probabilities, in chunks the predictor takes."""
        size, rules = self.predictor.batch_size, self.validator.rules
        parts = []
        for start in range(0, n, size):
            stop = min(start + size, n)
            chunk = columns if stop - start == n else {c: v[start:stop] for c, v in columns.items()}
            parts.append(self.predictor.score_validated(to_arrays(rules, chunk)))
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    @property
    def checkpoint(self) -> str:
        return str(self.predictor.info.get("checkpoint") or "")

    def describe(self) -> dict[str, Any]:
        """What /metadata says of the live model."""
        return {"checkpoint": self.checkpoint, "version": self.version,
                "loaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.loaded_at))}


def contract_change(old: RowValidator, new: RowValidator) -> str | None:
    """How ``new``'s input fields differ from ``old``'s (names, kinds, what each accepts), or None."""
    a = {f["name"]: f for f in old.fields()}
    b = {f["name"]: f for f in new.fields()}
    parts = []
    if added := sorted(b.keys() - a.keys()):
        parts.append(f"adds input fields {added}")
    if removed := sorted(a.keys() - b.keys()):
        parts.append(f"removes input fields {removed}")
    if changed := sorted(k for k in a.keys() & b.keys() if a[k] != b[k]):
        parts.append("reads " + ", ".join(f"{k!r} as {b[k]['kind']} ({b[k]['accepts']}) instead of "
                                          f"{a[k]['kind']} ({a[k]['accepts']})" for k in changed))
    return "; ".join(parts) or None


class LiveModel:
    """The live :class:`Served` and its swaps (see the module docstring)."""

    def __init__(self, served: Served) -> None:
        self.current = served
        self.swaps = 0
        self.refused: list[dict[str, str]] = []  # the latest refusals, newest last

    def swap(self, new: Served) -> None:
        """Make ``new`` live, after checking that clients' rows still mean the same to it."""
        change = contract_change(self.current.validator, new.validator)
        if change is not None:
            raise ConfigError(f"{new.checkpoint}: its pipeline {change}; clients' requests would be read "
                              "differently, so it is not served. Serve it with a new server instead")
        old, self.current = self.current, new
        self.swaps += 1
        log.info("worker %d now serves %s (%s), was %s (%s)", os.getpid(), new.checkpoint, new.version,
                 old.checkpoint, old.version)

    def refuse(self, path: Path, reason: str) -> None:
        log.error("worker %d refused checkpoint %s and keeps serving %s: %s", os.getpid(), path,
                  self.current.checkpoint, reason)
        self.refused = [*self.refused[-4:], {"checkpoint": path.name, "reason": reason}]

    def describe(self) -> dict[str, Any]:
        return {**self.current.describe(), "swaps": self.swaps, "refused": list(self.refused)}


def newest_checkpoint(directory: Path) -> Path | None:
    """The newest ``*.pt`` file of ``directory`` (modification time, then name), hidden files skipped."""
    best: tuple[int, str] | None = None
    found = None
    try:
        entries = list(os.scandir(directory))
    except OSError as e:
        log.warning("cannot list the watched directory %s: %s", directory, e)
        return None
    for e in entries:
        if e.name.startswith(".") or not e.name.endswith(".pt") or not e.is_file():
            continue
        key = (e.stat().st_mtime_ns, e.name)
        if best is None or key > best:
            best, found = key, Path(e.path)
    return found


def _identity(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def signature(path: Path) -> tuple[str, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (str(path), st.st_size, st.st_mtime_ns)


def default_since(served: Path | None, directory: Path) -> int:
    """The modification time (ns) a watched checkpoint must pass: the served file's when it lies in
    ``directory`` (what is already there is not new), else now."""
    if served is not None and served.resolve().parent == directory.resolve():
        sig = signature(served)
        if sig is not None:
            return sig[2]
    return time.time_ns()


class Watcher:
    """Polls a directory and swaps ``live`` to its newest checkpoint (see the module docstring)."""

    def __init__(self, live: LiveModel, directory: str | Path, *, interval: float = 1.0,
                 batch_size: int | None = None, since_ns: int | None = None) -> None:
        self.live, self.directory, self.interval = live, Path(directory), float(interval)
        if not self.directory.is_dir():
            raise ConfigError(f"--watch {directory}: not a directory; give the directory new checkpoints are "
                              "written to")
        self.batch_size = batch_size
        self.since_ns = since_ns if since_ns is not None else default_since(live.current.predictor.checkpoint,
                                                                            self.directory)
        self.tried: tuple[str, int, int] | None = None

    async def poll(self) -> bool:
        """One look at the directory; True when a new checkpoint was made live."""
        newest = newest_checkpoint(self.directory)
        sig = signature(newest) if newest is not None else None
        if newest is None or sig is None or sig == self.tried or sig[2] <= self.since_ns:
            return False
        self.tried = sig
        try:
            served = await anyio.to_thread.run_sync(Served.load, newest, self.batch_size)
            self.live.swap(served)
        except CtrkitError as e:
            self.live.refuse(newest, str(e))
            return False
        except Exception as e:
            log.exception("loading %s failed", newest)
            self.live.refuse(newest, f"{type(e).__name__}: {e}")
            return False
        self.since_ns = sig[2]
        return True

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            await self.poll()
