"""File-system helpers every writer shares: output directories, atomic files, temporary directories,
checksums and the "did you mean" hint.

A path that cannot be written (a file where a directory is needed, no permission) is a :class:`StoreError`
naming it and the option that set it; an I/O error while writing (disk full) is one too.
"""

from __future__ import annotations

import difflib
import errno
import fcntl
import hashlib
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ctrkit.errors import CheckpointError, DataError, StoreError


def path_exists(p: Path) -> bool:
    return p.exists() or p.is_symlink()


def is_empty_dir(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink() and next(p.iterdir(), None) is None


def remove_path(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def make_dir(path: Path, what: str = "output directory", option: str = "--out") -> Path:
    """Create directory ``path`` and its parents, or raise :class:`StoreError` naming the path and the cause
    (a regular file in the way, no permission)."""
    for q in (path, *path.parents):
        if path_exists(q):
            if not q.is_dir():
                where = "" if q == path else f" under {q}"
                raise StoreError(f"cannot create the {what} {path}{where}: {q} is a file, not a directory; "
                                 f"choose another {option}")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"cannot create the {what} {path} ({e.strerror or e}); choose another {option}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise StoreError(f"the {what} {path} is not writable; choose another {option} or fix its permissions")
    return path


@contextmanager
def atomic_file(path: Path, option: str = "--out", *, durable: bool = False) -> Iterator[Path]:
    """A temporary sibling of file ``path`` to write, renamed onto ``path`` when the block ends without error and
    removed otherwise (Ctrl-C included): a reader never sees a half-written file. ``durable``: the file and its
    directory are fsynced, so the new content survives a power cut once the block has ended (checkpoints). An
    I/O error (disk full) is a :class:`StoreError` naming ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        try:
            yield tmp
            if durable:
                _fsync(tmp)
            os.replace(tmp, path)
            if durable:
                _fsync(path.parent)
        except OSError as e:
            raise StoreError(f"cannot write {path} ({e.strerror or e}); choose another {option}") from None
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: Path, option: str = "--out") -> Iterator[Path]:
    """A new temporary sibling directory of ``path`` to fill, put in place of ``path`` by :func:`replace_path`
    when the block ends without error and removed otherwise: ``path`` holds either the old or the new
    directory, never a half-written one. An I/O error is a :class:`StoreError` naming ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    remove_path(tmp)  # left by a killed process of the same id
    try:
        try:
            tmp.mkdir()  # mkdir, not mkdtemp: the folder gets the umask's mode
            yield tmp
            replace_path(tmp, path)
        except OSError as e:
            raise StoreError(f"cannot write {path} ({e.strerror or e}); choose another {option}") from None
    finally:
        remove_path(tmp)


def replace_path(new: Path, dst: Path) -> None:
    """Rename ``new`` (a file or directory) to ``dst``. An existing ``dst`` is moved aside first and removed only
    once ``new`` is in place; if that rename fails, it is put back."""
    if not path_exists(dst):
        os.replace(new, dst)
        return
    old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
    remove_path(old)
    os.replace(dst, old)
    try:
        os.replace(new, dst)
    except BaseException:
        os.replace(old, dst)
        raise
    remove_path(old)


class RecordingWriter:
    """A file-like ``write`` / ``flush`` over ``file`` that keeps the OSError of a failed write: writers that turn
    it into an error naming no cause (torch.save's RuntimeError) still let the caller say why (disk full)."""

    def __init__(self, file: Any = None) -> None:
        self.file = file
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


def write_failure(path: Path, e: BaseException, what: str, option: str) -> str:
    """One line on ``what`` at ``path`` that could not be written: the cause, the free space there, the fix."""
    cause = (e.strerror or str(e)) if isinstance(e, OSError) else (str(e).strip().splitlines() or [""])[0]
    try:
        free = f"; {shutil.disk_usage(path.parent).free / 2**20:,.0f} MiB free there"
    except OSError:
        free = ""
    full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    return (f"cannot write {what} {path} ({cause}{free}); the file there before, if any, is unchanged: "
            + ("free space or " if full else "") + f"choose another {option}")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_dir(near: Path, prefix: str) -> Path:
    """A new temporary directory inside ``near`` (created: :func:`make_dir`), on the output's file system."""
    make_dir(near)
    try:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=near))
    except OSError as e:
        raise StoreError(f"cannot write in {near} ({e.strerror or e}); choose another --out or fix its "
                         "permissions") from None


SCRATCH_OWNER = ".owner"  # in a scratch directory: the file its process holds an flock on while it runs


def scratch_dir(near: Path, prefix: str) -> tuple[Path, int]:
    """A new temporary directory in ``near`` (:func:`temp_dir`) owned by this process: its ``.owner`` file is
    flock-ed (the lock is taken on a file of another name that is then renamed, so ``.owner`` never exists
    unlocked), and the kernel drops the lock when the process dies, however it dies. Returns (path, the lock's
    file descriptor: close it after removing the directory). :func:`remove_stale_scratch` removes the directories
    whose owner is gone."""
    path = temp_dir(near, prefix)
    taking = path / f"{SCRATCH_OWNER}.{os.getpid()}"
    fd = os.open(taking, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
    os.write(fd, str(os.getpid()).encode())
    os.replace(taking, path / SCRATCH_OWNER)
    return path, fd


def remove_stale_scratch(near: Path, pattern: str) -> list[Path]:
    """Remove the directories of ``near`` matching ``pattern`` made by :func:`scratch_dir` whose process is gone (a
    killed run's scratch files); those of a live process stay. Returns the removed paths."""
    removed = []
    for d in sorted(near.glob(pattern)) if near.is_dir() else []:
        owner = d / SCRATCH_OWNER
        if d.is_symlink() or not owner.is_file():
            continue
        try:
            fd = os.open(owner, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # taken: its process is gone
        except OSError:
            os.close(fd)
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)
        finally:
            os.close(fd)
        removed.append(d)
    return removed


def file_sha256(path: Path) -> str:
    """``sha256:<hex>`` of the whole file, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def verify_files(root: Path, files: Mapping[str, str], what: str) -> None:
    """A CheckpointError unless every file of ``files`` (name under ``root`` -> :func:`file_sha256`) has its hash."""
    for name, want in files.items():
        f = root / name
        if want != (got := file_sha256(f) if f.is_file() else "missing"):
            raise CheckpointError(f"{f} fails its checksum (stored {want}, content {got}): the {what} was changed or "
                                  "damaged after it was written; it is refused, not scored")


def file_checksum(path: Path, full: bool = False) -> str:
    """sha256 of the whole file (``full``) or of its size + first and last MiB (cheap, checked on open); a directory
    (a sharded checkpoint): of its files' relative names and checksums."""
    h = hashlib.sha256()
    if path.is_dir():
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(f"{f.relative_to(path)}={file_checksum(f, full)}\n".encode())
        return ("sha256:" if full else "quick:") + h.hexdigest()
    size = path.stat().st_size
    with open(path, "rb") as f:
        if full:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
            return "sha256:" + h.hexdigest()
        h.update(str(size).encode())
        h.update(f.read(1 << 20))
        if size > 1 << 20:
            f.seek(max(1 << 20, size - (1 << 20)))
            h.update(f.read(1 << 20))
    return "quick:" + h.hexdigest()


QUICK_CRC = "quick-crc32:"


def quick_checksum(path: Path) -> str:
    """CRC-32 of a file's size (as text) and its first and last MiB, the bytes :func:`file_checksum`'s quick form
    hashes with sha256 -> ``"quick-crc32:xxxxxxxx"``: a cheap change check on open (a store column's every byte has
    a CRC-32 of its own, checked once per change: :mod:`ctrkit.data.storage.verify`), at about three times
    sha256's speed here."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        crc = zlib.crc32(f.read(1 << 20), zlib.crc32(str(size).encode()))
        if size > 1 << 20:
            f.seek(max(1 << 20, size - (1 << 20)))
            crc = zlib.crc32(f.read(1 << 20), crc)
    return f"{QUICK_CRC}{crc:08x}"


def check_quick(path: Path, want: str, verify: bool) -> str | None:
    """The checksum of ``path`` in the form of ``want`` (a manifest's: quick sha256, quick CRC-32 or full sha256)
    when that form is checked on open (quick forms always, a full sha256 only with ``verify``), else None."""
    if want.startswith(QUICK_CRC):
        return quick_checksum(path)
    if want.startswith("quick:") or verify:
        return file_checksum(path, full=want.startswith("sha256:"))
    return None


def check_distinct_inputs(named: Iterable[tuple[str, Path]]) -> None:
    """:class:`DataError` when two of the ``(what, path)`` inputs are one file: the same path twice, a symlink
    and its target, or two hard links (compared by device and inode). Every row would be read twice, and in a
    split by fractions most rows of one copy would land in train and the other copy's in valid / test."""
    seen: dict[tuple[int, int], tuple[str, Path]] = {}
    for what, path in named:
        try:
            st = os.stat(path)
        except OSError:
            continue  # a missing file is the reader's error, with its own message
        key = (st.st_dev, st.st_ino)
        if key not in seen:
            seen[key] = (what, Path(path))
            continue
        first = seen[key]
        same = "the same path" if first[1] == Path(path) else f"the same file ({Path(path).resolve()})"
        raise DataError(f"{first[0]} {first[1]} and {what} {path} are {same}: every row would be read twice "
                        "(and rows of one copy would land in train, their twins in valid / test); give each "
                        "input once")


def link_tree(src: Path, dst: Path) -> None:
    """Hard-link (or copy when linking fails) every file of ``src`` into a new directory ``dst``."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        try:
            os.link(f, dst / f.name)
        except OSError:
            shutil.copy2(f, dst / f.name)


# ---- "did you mean" -------------------------------------------------------------------------------------
def closest(name: str, valid: Iterable[str], *, aliases: Mapping[str, str] | None = None,
            cutoff: float = 0.5) -> str | None:
    """The valid name ``name`` most likely meant: its alias (``aliases``, matched case-insensitively) when that
    is valid, else the closest spelling (``difflib``, at least ``cutoff`` similar), else None."""
    valid = [str(v) for v in valid]
    alias = (aliases or {}).get(str(name).lower())
    if alias in valid:
        return alias
    close = difflib.get_close_matches(str(name), valid, n=1, cutoff=cutoff)
    return close[0] if close else None


def did_you_mean(name: str, valid: Iterable[str], *, aliases: Mapping[str, str] | None = None) -> str:
    """``" (did you mean 'x'?)"`` for the closest valid name (:func:`closest`), or ``""``."""
    near = closest(name, valid, aliases=aliases)
    return f" (did you mean {near!r}?)" if near is not None else ""


def missing_path(path: object, what: str, hint: str = "") -> str:
    """The message for a file that is not there: ``what`` and the path (with the working directory when relative),
    the closest name beside it (a typo) or the first missing folder, then ``hint`` (how to make or find one)."""
    p = Path(str(path))
    where = "" if p.is_absolute() else f" (relative to the working directory {os.getcwd()})"
    msg = f"{what} {p} does not exist{where}"
    parent = p.parent
    if parent.is_dir():
        try:
            names = [c.name for c in parent.iterdir()]
        except OSError:
            names = []
        near = closest(p.name, names, cutoff=0.6)
        if near is not None:
            msg += f"; did you mean {parent / near}?"
    else:
        missing = parent
        while not missing.parent.is_dir() and missing.parent != missing:
            missing = missing.parent
        msg += f"; the folder {missing} does not exist either"
    return f"{msg}{' ' if msg.endswith('?') else '. '}{hint}" if hint else msg
