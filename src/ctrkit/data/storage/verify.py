"""Whole-content checks of a store's column files: a damaged byte anywhere in a column is an error when the store
is opened, not a silently wrong id.

Writing: :class:`ContentHash` keeps a CRC-32 of every byte appended to a column file (after its header, which
numpy's own parse and the manifest's shape / dtype check cover), at no extra read; the manifest records it as
``"content": "crc32:<8 hex digits>"``. CRC-32 (zlib) rather than SHA-256: it is what catches accidental damage
(a zeroed range, a torn copy, a truncated write) in zip, gzip, PNG and Parquet pages, it reads at about 2.4 GB/s
on one core against 0.9 GB/s for SHA-256 on the same machine, and it releases the GIL, so the files of a store
are checked by several threads at once. It is no defence against a deliberate forgery, which is not the threat.

Opening: :func:`verify_content` reads every listed file once and compares. A file already verified is not read
again while it is the same file: same device, inode, size, modification time and status-change time (ctime,
which every write, truncate, rename or chmod moves and no user call can set back), recorded per store in
``<store>/.verified.json``. The writer records its files there as it publishes the store (their CRC-32 is of the
bytes it wrote and fsynced), so a fresh store is not read back; a copy on another disk or machine, or any file
touched since, is read once on its next open. A store whose directory cannot be written is verified on every
open (and says so once). Measured figures: ``benchmarks/store_verify.py``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctrkit.errors import StoreError

log = logging.getLogger(__name__)
CACHE = ".verified.json"
_BLOCK = 8 << 20
_read_only_said: set[str] = set()
_lock = threading.Lock()


class ContentHash:
    """CRC-32 of the bytes of a column file after its header, fed in the order they are written."""

    def __init__(self) -> None:
        self.crc = 0

    def update(self, data: bytes | memoryview) -> None:
        self.crc = zlib.crc32(data, self.crc)

    def hexdigest(self) -> str:
        return f"crc32:{self.crc:08x}"


@dataclass(frozen=True)
class Part:
    """One file to check: its path, where its content starts (after the .npy header) and the recorded value."""

    path: Path
    offset: int
    want: str


def content_checksum(path: Path, offset: int) -> str:
    """``crc32:<hex>`` of the bytes of ``path`` from ``offset`` on, read in blocks."""
    crc, buf = 0, bytearray(_BLOCK)
    view = memoryview(buf)
    with open(path, "rb") as f:
        f.seek(offset)
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
    return f"crc32:{crc:08x}"


def _key(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def verify_columns(store: Path, columns: dict[str, Any], header: int) -> None:
    """:func:`verify_content` of every column file of a store (``columns``: the manifest's; ``header``: the
    length of the .npy header its writer gives every file). A missing file is left to the caller's message;
    files of stores written before content checksums have only the quick check (said once per open)."""
    parts, old = [], 0
    for col in columns.values():
        for spec in col["files"].values():
            if "content" not in spec:
                old += 1
            elif (store / spec["file"]).is_file():
                parts.append(Part(store / spec["file"], header, spec["content"]))
    if old:
        log.info("store %s was written before whole-content checksums: only the size and the first and last MiB "
                 "of its files are checked; re-run the preprocessing to check every byte", store)
    verify_content(store, parts)


def verify_content(store: Path, parts: Sequence[Part], threads: int | None = None) -> int:
    """Raise :class:`StoreError` naming the first file of ``parts`` whose content differs from its recorded
    checksum; files unchanged since their last check are skipped (see the module docstring). Returns the bytes
    read."""
    cache = _load(store)
    todo = [p for p in parts if cache.get(p.path.name) != {"key": _key(p.path.stat()), "content": p.want}]
    if not todo:
        return 0
    workers = max(1, min(threads or os.cpu_count() or 1, 8, len(todo)))
    with ThreadPoolExecutor(workers, thread_name_prefix="ctrkit-verify") as pool:
        got = list(pool.map(lambda p: (p, _stat_and_sum(p)), todo))
    for p, (key, value) in got:
        if value != p.want:
            raise StoreError(f"{p.path} does not match its checksum in manifest.json (content {value}, recorded "
                             f"{p.want}): the file was changed, truncated or damaged after it was written; re-run "
                             "the preprocessing that wrote this store")
        cache[p.path.name] = {"key": key, "content": p.want}
    _save(store, cache)
    return sum(p.path.stat().st_size - p.offset for p in todo)


def record_written(store: Path, parts: Sequence[Part]) -> None:
    """Record ``parts`` (files just written, closed and fsynced, with the CRC-32 of what was written) as verified."""
    _save(store, {p.path.name: {"key": _key(p.path.stat()), "content": p.want} for p in parts})


def _stat_and_sum(p: Part) -> tuple[list[int], str]:
    before = _key(p.path.stat())
    value = content_checksum(p.path, p.offset)
    return (before if _key(p.path.stat()) == before else []), value  # changed while read: not cached


def _load(store: Path) -> dict:
    try:
        data = json.loads((store / CACHE).read_text())
        return data["files"] if data.get("version") == 1 and isinstance(data.get("files"), dict) else {}
    except (OSError, ValueError, KeyError, AttributeError):
        return {}


def _save(store: Path, files: dict) -> None:
    tmp = store / f"{CACHE}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        tmp.write_text(json.dumps({"version": 1, "files": files}))
        os.replace(tmp, store / CACHE)
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        with _lock:
            if str(store) not in _read_only_said:
                _read_only_said.add(str(store))
                log.info("store %s: cannot record its verified files (%s); its columns are read in full on "
                         "every open", store, e.strerror or e)
