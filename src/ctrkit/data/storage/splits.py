"""Split stores written together: every store of one preprocess run (train / valid / test) is staged, then
published at once by :class:`SplitOutput`, so a failure or Ctrl-C leaves the output folder as it was; an
``--overwrite`` run removes the splits it no longer writes (:func:`remove_stale_splits`)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from ctrkit.data.storage.store import check_replaceable
from ctrkit.errors import StoreError
from ctrkit.io import make_dir, path_exists, remove_stale_scratch, scratch_dir

log = logging.getLogger(__name__)
SCRATCH_PATTERN = ".*-tmp-*"  # the scratch directories of preprocessing runs (``.criteo-tmp-...``), not the
# resumable ``.criteo-stage-<key>`` of a --workers run, which is kept on purpose


def remove_stale_splits(out: str | Path, written: Any, splits: tuple[str, ...]) -> list[Path]:
    """After ``--overwrite``: delete the stores of ``splits`` under ``out`` that this run did not write
    (``written``), so an old valid/test never sits next to a new train. Returns the removed paths;
    a directory that is not a store is left alone."""
    removed = []
    for name in splits:
        path = Path(out) / name
        if name in written or not (path / "manifest.json").is_file():
            continue
        shutil.rmtree(path)
        removed.append(path)
        log.info("removed %s: --overwrite and this run wrote no %r split", path, name)
    return removed


class SplitOutput:
    """The split stores ``out/<split>`` of one preprocessing run, staged and published together.

    On entry it checks that ``out`` can take them (:func:`check_replaceable` for every split, ``out`` a
    writable directory: :func:`make_dir`) and makes ``tmp``, a ``<prefix>*`` directory inside ``out`` for the
    run's scratch files (owned by this process: :func:`~ctrkit.io.scratch_dir`), after removing the scratch
    directories of earlier runs into ``out`` that were killed (their process is gone). Stores are written to :meth:`stage` paths inside it; :meth:`publish` moves them into
    place, replacing existing stores with ``overwrite`` and then also moving away the stores of the splits
    this run did not write (an old valid / test never sits next to a new train). Whatever fails or is
    interrupted (Ctrl-C) before that leaves ``out`` as it was: the staging directory is removed on any exit,
    and a failing publish moves every store back. An I/O error (disk full) becomes one :class:`StoreError`.
    """

    def __init__(self, out: str | Path, splits: tuple[str, ...], *, overwrite: bool, prefix: str) -> None:
        self.out, self.splits, self.overwrite = Path(out), tuple(splits), overwrite
        for s in self.splits:
            check_replaceable(self.out / s, overwrite)
        make_dir(self.out)
        for stale in remove_stale_scratch(self.out, SCRATCH_PATTERN):
            log.warning("removed %s: the scratch files of a preprocessing run into %s that was killed", stale,
                        self.out)
        self.tmp, self._owner = scratch_dir(self.out, prefix)

    def stage(self, name: str) -> Path:
        """Where to write the store of split ``name`` before :meth:`publish`."""
        return self.tmp / "stores" / name

    def publish(self, names: list[str]) -> dict[str, Path]:
        """Move the staged stores ``names`` to ``out/<name>`` -> {name: path} (see the class docstring)."""
        moved: list[tuple[Path, Path]] = []  # (from, to), undone in reverse on failure
        try:
            for s in self.splits:
                dst = self.out / s
                if s in names:
                    if path_exists(dst):
                        check_replaceable(dst, self.overwrite)  # appeared while this run worked?
                        moved.append((dst, self.tmp / f"old-{s}"))
                        os.replace(*moved[-1])
                    moved.append((self.stage(s), dst))
                    os.replace(*moved[-1])
                elif self.overwrite and (dst / "manifest.json").is_file():
                    moved.append((dst, self.tmp / f"old-{s}"))
                    os.replace(*moved[-1])
                    log.info("removed %s: --overwrite and this run wrote no %r split", dst, s)
        except BaseException:
            for src, dst in reversed(moved):
                os.replace(dst, src)
            raise
        return {s: self.out / s for s in self.splits if s in names}

    def __enter__(self) -> SplitOutput:  # noqa: PYI034
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)  # scratch files, unpublished stores, replaced old stores
        os.close(self._owner)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise StoreError(f"disk full while preprocessing into {self.out} ({exc.strerror}); its partial output "
                             "was removed and nothing was published: free space there or choose another --out") from exc
        if isinstance(exc, OSError):
            raise StoreError(f"preprocessing into {self.out} stopped by an I/O error ({exc}); nothing was "
                             "published there") from exc
