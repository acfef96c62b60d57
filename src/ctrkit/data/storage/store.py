"""Columnar store: a directory with ``manifest.json`` and one ``.npy`` per column, memory-mapped.

Layout::

    store/
      manifest.json         schema, row count, per-column kind/dtype/shape/files/checksums (a quick one:
                            CRC-32 of size + first and last MiB, sha256 in stores written before; and a
                            CRC-32 of the whole content),
                            preprocessing options and statistics
      .verified.json        which files were verified in full, and when (see verify.py)
      label.npy             float32 [N]
      I1.npy                float32 [N]          (dense; [N, dim] for vector features)
      C1.npy                int32|int64 [N]      (single-valued sparse ids)
      tags.values.npy       int32|int64 [nnz]    (multi-valued / sequence ids, jagged)
      tags.offsets.npy      int64 [N + 1]

Column kinds: ``label``, ``weight``, ``group``, ``dense``, ``sparse`` (one id per row) and ``jagged``
(values + offsets). Sparse columns are exactly the key-major KeyedJagged layout once sliced and
concatenated, which is why the loader needs no per-row work.

Writing streams: :class:`StoreWriter` appends chunks to ``.npy`` files whose header is rewritten
with the final row count on commit. Everything is written into a temporary sibling directory that
is renamed into place only after the manifest is complete, so a failure never leaves a directory
that opens as a valid store. Opening a store checks every column over its whole content
(:mod:`ctrkit.data.storage.verify`: once per file while the file is unchanged). The preprocessors write their split stores through :class:`~ctrkit.data.storage.splits.SplitOutput`:
all of them are staged and published together, so a failure or Ctrl-C leaves ``out`` as it was.

Output paths: an existing path is replaced only with ``overwrite`` (``--overwrite``), and only if it is a
store or a regular file; an empty directory counts as absent; a directory that is not a store is never
replaced. A path that cannot be written (a file where a directory is needed, no permission) is a
:class:`StoreError` naming it, raised before any work; an I/O error while writing (disk full) is one too.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.data.pipeline.rows import ColumnSpec
from ctrkit.data.storage.verify import ContentHash, Part, record_written, verify_columns
from ctrkit.errors import StoreError
from ctrkit.io import (
    check_quick,
    file_checksum,
    is_empty_dir,
    path_exists,
    quick_checksum,
    replace_path,
    temp_dir,
)
from ctrkit.schema import Schema

FORMAT = "ctrkit-store"


VERSION = 1


KINDS = ("label", "weight", "group", "dense", "sparse", "jagged")


_HEADER_BYTES = 128  # fixed .npy v1 header size, so the header can be rewritten in place


log = logging.getLogger(__name__)


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    d = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
    body = repr(d).encode("latin1")
    pad = _HEADER_BYTES - 10 - len(body) - 1
    if pad < 0:
        raise StoreError(f"shape {shape} does not fit a {_HEADER_BYTES}-byte .npy header")
    return b"\x93NUMPY\x01\x00" + (_HEADER_BYTES - 10).to_bytes(2, "little") + body + b" " * pad + b"\n"


class _AppendArray:
    """A .npy file that grows along axis 0; its header is fixed up on close."""

    def __init__(self, path: Path, dtype: np.dtype, inner: tuple[int, ...] = ()) -> None:
        self.path, self.dtype, self.inner, self.rows = path, np.dtype(dtype), tuple(inner), 0
        self.content = ContentHash()  # of every byte after the header, as written
        self.f = open(path, "wb")  # noqa: SIM115 - kept open while chunks are appended; closed in close()
        self.f.write(_npy_header(self.dtype, (0, *self.inner)))

    def append(self, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a, dtype=self.dtype)
        if a.shape[1:] != self.inner:
            raise StoreError(f"{self.path.name}: chunk has inner shape {a.shape[1:]}, expected {self.inner}")
        data = memoryview(a.reshape(-1)).cast("B")  # the array's bytes without a copy
        self.content.update(data)
        self.f.write(data)
        self.rows += a.shape[0]

    def close(self) -> tuple[int, ...]:
        shape = (self.rows, *self.inner)
        self.f.seek(0)
        self.f.write(_npy_header(self.dtype, shape))
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        return shape


def check_replaceable(path: Path, overwrite: bool, option: str = "--out") -> None:
    """Raise :class:`StoreError` unless ``path`` may be written: absent or an empty directory, or with
    ``overwrite`` a store or a regular file (see the module docstring); ``option`` names the path's option."""
    if not path_exists(path) or is_empty_dir(path):
        return
    if not overwrite:
        raise StoreError(f"output {path} already exists; choose another {option} or pass --overwrite")
    if path.is_dir() and not (path / "manifest.json").is_file():
        raise StoreError(f"output {path} is a directory that is not a ctrkit store (no manifest.json); --overwrite "
                         f"replaces stores only: remove it yourself or choose another {option}")


class StoreWriter:
    """Streams columns into a new store at ``path``; ``commit()`` publishes it atomically.

    Use as a context manager: on an exception the temporary directory is removed and nothing is
    published.

        with StoreWriter(path, schema, columns) as w:
            w.append({"label": y, "I1": x1, "tags": (values, lengths)})
            w.set_meta(preprocessing={...}, stats={...})
    """

    def __init__(
        self, path: str | Path, schema: Schema, columns: list[ColumnSpec], overwrite: bool = False,
        full_checksums: bool = False,
    ) -> None:
        self.path = Path(path)
        check_replaceable(self.path, overwrite)
        for c in columns:
            if c.kind not in KINDS:
                raise StoreError(f"column {c.name!r}: kind {c.kind!r} is not one of {KINDS}")
        self.tmp = temp_dir(self.path.parent, f".{self.path.name}.tmp-")
        self.schema, self.columns, self.overwrite, self.full = schema, columns, overwrite, full_checksums
        self.meta: dict[str, Any] = {}
        self.rows = 0
        self._arrays: dict[str, dict[str, _AppendArray]] = {}
        self._nnz: dict[str, int] = {}
        self._closed = False
        try:
            self._open_columns(columns)
        except BaseException as e:
            self.abort()
            if isinstance(e, OSError):
                raise StoreError(f"cannot write the store {self.path} ({e.strerror or e})") from None
            raise

    def _open_columns(self, columns: list[ColumnSpec]) -> None:
        for c in columns:
            if c.kind == "jagged":
                self._arrays[c.name] = {
                    "values": _AppendArray(self.tmp / f"{c.name}.values.npy", np.dtype(c.dtype)),
                    "offsets": _AppendArray(self.tmp / f"{c.name}.offsets.npy", np.dtype(np.int64)),
                }
                self._arrays[c.name]["offsets"].append(np.zeros(1, np.int64))
                self._nnz[c.name] = 0
            else:
                self._arrays[c.name] = {"data": _AppendArray(self.tmp / f"{c.name}.npy", np.dtype(c.dtype), c.inner)}

    def append(self, chunk: dict[str, Any]) -> None:
        """Append one chunk of rows. Jagged columns take (values, lengths); others an array [n, ...]."""
        missing = [c.name for c in self.columns if c.name not in chunk]
        extra = sorted(set(chunk) - {c.name for c in self.columns})
        if missing or extra:
            raise StoreError(f"chunk columns mismatch: missing {missing}, unexpected {extra}")
        n = None
        for c in self.columns:
            item = chunk[c.name]
            if c.kind == "jagged":
                values, lengths = item
                lengths = np.asarray(lengths, dtype=np.int64)
                rows = lengths.shape[0]
                offs = self._nnz[c.name] + np.cumsum(lengths)
                if len(values) != (offs[-1] - self._nnz[c.name] if rows else 0):
                    raise StoreError(f"column {c.name!r}: {len(values)} values but lengths sum to another count")
                self._arrays[c.name]["values"].append(np.asarray(values))
                self._arrays[c.name]["offsets"].append(offs)
                self._nnz[c.name] = int(offs[-1]) if rows else self._nnz[c.name]
            else:
                rows = len(item)
                self._arrays[c.name]["data"].append(np.asarray(item))
            if n is None:
                n = rows
            elif rows != n:
                raise StoreError(f"column {c.name!r} has {rows} rows in this chunk, other columns {n}")
        self.rows += n or 0

    def set_meta(self, **meta: Any) -> None:
        self.meta.update(meta)

    def commit(self) -> Path:
        cols: dict[str, Any] = {}
        for c in self.columns:
            files = {}
            for part, arr in self._arrays[c.name].items():
                shape = arr.close()
                files[part] = {
                    "file": arr.path.name,
                    "dtype": np.dtype(arr.dtype).str,
                    "shape": list(shape),
                    "checksum": file_checksum(arr.path, True) if self.full else quick_checksum(arr.path),
                    "content": arr.content.hexdigest(),
                }
            cols[c.name] = {"kind": c.kind, "files": files}
        self._closed = True
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "num_rows": self.rows,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "schema": self.schema.to_dict(),
            "columns": cols,
            **self.meta,
        }
        (self.tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, default=_json_default))
        record_written(self.tmp, [Part(arr.path, _HEADER_BYTES, arr.content.hexdigest())
                                  for parts in self._arrays.values() for arr in parts.values()])
        if path_exists(self.path):
            if not (self.overwrite or is_empty_dir(self.path)):
                raise StoreError(f"output {self.path} appeared while writing; not replacing it")
            check_replaceable(self.path, True)
        replace_path(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Close the files and remove the temporary directory: nothing is published."""
        self._closed = True
        for parts in self._arrays.values():
            for arr in parts.values():
                if not arr.f.closed:
                    arr.f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> StoreWriter:  # noqa: PYI034
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and self.tmp.exists():
            try:
                self.commit()
                return
            except OSError as e:
                exc = e
            except BaseException:
                self.abort()
                raise
        if exc_type is not None or exc is not None:
            self.abort()
        if isinstance(exc, OSError):  # disk full, file system gone read-only: one line naming the store
            if getattr(exc, "errno", None) == errno.ENOSPC:
                raise StoreError(f"disk full while writing the store {self.path} ({exc.strerror}); nothing was "
                                 "written there: free space or choose another --out") from exc
            raise StoreError(f"writing the store {self.path} failed ({exc}); nothing was written there") from exc


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def write_store(
    path: str | Path, schema: Schema, arrays: dict[str, Any], kinds: dict[str, str], overwrite: bool = False,
    **meta: Any,
) -> Path:
    """Write in-memory columns in one go (tests, synthetic data). ``kinds`` maps column -> kind;
    jagged columns are given as (values, lengths)."""
    specs = []
    for name, kind in kinds.items():
        a = arrays[name]
        if kind == "jagged":
            specs.append(ColumnSpec(name, kind, np.asarray(a[0]).dtype.str))
        else:
            a = np.asarray(a)
            specs.append(ColumnSpec(name, kind, a.dtype.str, tuple(a.shape[1:])))
    with StoreWriter(path, schema, specs, overwrite=overwrite) as w:
        w.append({n: arrays[n] for n in kinds})
        w.set_meta(**meta)
    return Path(path)


class Store:
    """A memory-mapped store. ``store["C1"]`` is a read-only array; jagged columns give
    (values, offsets). ``verify`` (default): check every column over its whole content against the manifest's
    CRC-32 (:mod:`~ctrkit.data.storage.verify`; a file is read once while it is unchanged); without it only the
    size and the first and last MiB of each file are checked."""

    def __init__(self, path: str | Path, verify: bool = True) -> None:
        self.path = Path(path)
        mpath = self.path / "manifest.json"
        if not mpath.is_file():
            raise StoreError(_not_a_store(self.path))
        try:
            self.manifest: dict[str, Any] = json.loads(mpath.read_text())
        except json.JSONDecodeError as e:
            raise StoreError(f"{mpath} is not valid JSON ({e}); re-run the preprocessing") from e
        if self.manifest.get("format") != FORMAT or self.manifest.get("version") != VERSION:
            raise StoreError(f"{mpath}: not a {FORMAT} v{VERSION} manifest; re-run the preprocessing")
        self.schema = Schema.from_dict(self.manifest["schema"])
        self.num_rows: int = int(self.manifest["num_rows"])
        self.kinds: dict[str, str] = {n: c["kind"] for n, c in self.manifest["columns"].items()}
        self._cols: dict[str, Any] = {}
        if verify:  # every byte of every column (the files unchanged since their last check are not read again)
            verify_columns(self.path, self.manifest["columns"], _HEADER_BYTES)
        for name, col in self.manifest["columns"].items():
            parts = {}
            for part, spec in col["files"].items():
                parts[part] = self._open(spec, verify)
            rows = parts["offsets"].shape[0] - 1 if "offsets" in parts else parts["data"].shape[0]
            if rows != self.num_rows:
                raise StoreError(
                    f"{self.path}: column {name!r} has {rows} rows but the manifest says {self.num_rows}; "
                    "the store is damaged, re-run the preprocessing"
                )
            self._cols[name] = parts
    def _open(self, spec: dict[str, Any], verify: bool) -> np.ndarray:
        f = self.path / spec["file"]
        if not f.is_file():
            raise StoreError(f"{f} listed in the manifest is missing; re-run the preprocessing")
        want = spec["checksum"]
        whole = verify and "content" in spec  # every byte is checked by verify_columns instead
        if not whole:  # quick (sha256 or CRC-32) always; sha256 (full_checksums) with verify: read whole, uncached
            got = check_quick(f, want, verify)
            if got is not None and got != want:
                raise StoreError(
                    f"{f} does not match its checksum in manifest.json (file changed or truncated); "
                    "re-run the preprocessing"
                )
        try:
            arr = np.load(f, mmap_mode="r")
        except ValueError as e:
            raise StoreError(f"{f} is not a readable .npy file ({e}); re-run the preprocessing") from e
        if list(arr.shape) != spec["shape"] or arr.dtype.str != spec["dtype"] or not arr.flags.c_contiguous:
            order = "" if arr.flags.c_contiguous else " in Fortran order"
            raise StoreError(f"{f} holds {arr.dtype.str}{list(arr.shape)}{order} but the manifest says "
                             f"{spec['dtype']}{spec['shape']}; re-run the preprocessing")
        return arr

    def __len__(self) -> int:
        return self.num_rows

    def __contains__(self, name: str) -> bool:
        return name in self._cols

    def __getitem__(self, name: str) -> Any:
        if name not in self._cols:
            raise KeyError(f"store {self.path} has no column {name!r}; columns: {list(self._cols)}")
        parts = self._cols[name]
        return (parts["values"], parts["offsets"]) if "offsets" in parts else parts["data"]

    def columns(self, kind: str | None = None) -> list[str]:
        return [n for n, k in self.kinds.items() if kind is None or k == kind]

    @property
    def preprocessing(self) -> dict[str, Any]:
        return self.manifest.get("preprocessing", {})

    @property
    def stats(self) -> dict[str, Any]:
        return self.manifest.get("stats", {})

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r}, rows={self.num_rows}, columns={len(self._cols)})"


def _not_a_store(path: Path) -> str:
    """Why ``path`` is not a store, and which path to give instead."""
    splits = [n for n in ("train", "valid", "test") if (path / n / "manifest.json").is_file()]
    if splits:
        return (f"{path} is the folder `ctrkit preprocess` wrote, not one store; give its splits: "
                + ", ".join(f"data.{n}={path / n}" for n in splits))
    if path.is_file():
        return (f"{path} is a file, not a ctrkit store; preprocess it first (`ctrkit preprocess criteo|table "
                f"{path} --out DIR`) and give DIR/train, DIR/valid and DIR/test")
    return f"{path} is not a ctrkit store (no manifest.json); create one with `ctrkit preprocess`"
