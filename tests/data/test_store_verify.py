"""Store columns are verified over their whole content when a store is opened (issue 27): a zeroed range in the
middle of a column, which the quick check (size, first and last MiB) passes, is an error naming the file; an
unchanged file is not read again; a change that keeps the size and the modification time is still seen."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from ctrkit.data.storage import verify
from ctrkit.data.storage.store import Store, write_store
from ctrkit.errors import StoreError
from ctrkit.schema import DenseFeature, Schema, SparseFeature

N = 1_000_000  # 4 MB per int32 column: its middle is outside the first and last MiB


def make_store(path: Path) -> Path:
    rng = np.random.default_rng(0)
    schema = Schema(dense=[DenseFeature("x")], sparse=[SparseFeature("c", 1000, 4)])
    cols = {"label": rng.integers(0, 2, N).astype(np.float32), "x": rng.random(N, np.float32),
            "c": rng.integers(2, 1000, N).astype(np.int32)}
    return write_store(path, schema, cols, {"label": "label", "x": "dense", "c": "sparse"})


def zero_middle(path: Path, count: int = 10_000) -> None:
    """Zero ``count`` int32 ids in the middle of ``path``, keeping its size and modification time."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        f.write(b"\0" * 4 * count)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_zeroed_ids_in_the_middle_of_a_column_are_found(tmp_path: Path) -> None:
    path = make_store(tmp_path / "s")
    (path / verify.CACHE).unlink()
    Store(path)  # sound, and recorded as verified
    zero_middle(path / "c.npy")
    Store(path, verify=False)  # the quick check alone does not see it (the silent wrong result of the issue)
    with pytest.raises(StoreError, match=r"c\.npy does not match its checksum in manifest.json \(content crc32:.*re-run the preprocessing"):
        Store(path)


def test_an_unchanged_store_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_store(tmp_path / "s")
    calls: list[Path] = []
    real = verify.content_checksum
    monkeypatch.setattr(verify, "content_checksum", lambda p, o: calls.append(p) or real(p, o))
    Store(path)
    assert calls == []  # the writer recorded what it wrote: a fresh store is not read back
    (path / verify.CACHE).unlink()  # as a copy elsewhere would be
    Store(path)
    assert sorted(p.name for p in calls) == ["c.npy", "label.npy", "x.npy"]
    calls.clear()
    Store(path)
    assert calls == []  # unchanged: not read again
    (path / "x.npy").chmod(0o644)  # any change of the file's status (ctime) makes it be read again
    Store(path)
    assert [p.name for p in calls] == ["x.npy"]


def test_manifest_records_crc32_of_the_content(tmp_path: Path) -> None:
    import zlib

    path = make_store(tmp_path / "s")
    spec = json.loads((path / "manifest.json").read_text())["columns"]["c"]["files"]["data"]
    raw = (path / "c.npy").read_bytes()
    assert spec["content"] == f"crc32:{zlib.crc32(raw[128:]):08x}"  # everything after the 128-byte header


def test_a_store_that_cannot_record_is_verified_on_every_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             caplog) -> None:
    path = make_store(tmp_path / "s")
    (path / verify.CACHE).unlink()

    def read_only(src, dst):  # what a read-only directory does (the tests may run as root, who can write it)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(verify.os, "replace", read_only)
    calls: list[Path] = []
    real = verify.content_checksum
    monkeypatch.setattr(verify, "content_checksum", lambda p, o: calls.append(p) or real(p, o))
    with caplog.at_level("INFO", logger="ctrkit.data.storage.verify"):
        Store(path)
        Store(path)
    assert len(calls) == 6 and not list(path.glob("*.tmp"))
    assert caplog.text.count("read in full on every open") == 1


def test_a_store_written_before_content_checksums_still_opens(tmp_path: Path, caplog) -> None:
    path = make_store(tmp_path / "s")
    manifest = json.loads((path / "manifest.json").read_text())
    for col in manifest["columns"].values():
        for spec in col["files"].values():
            del spec["content"]
    (path / "manifest.json").write_text(json.dumps(manifest))
    with caplog.at_level("INFO", logger="ctrkit.data.storage.verify"):
        assert len(Store(path)) == N
    assert "before whole-content checksums" in caplog.text


def test_quick_checksum_is_crc32_of_size_and_first_and_last_mib_and_older_sha256_ones_still_check(
        tmp_path: Path) -> None:
    """New stores record the quick check as a CRC-32 of the size and the first and last MiB (zlib, by hand here);
    a change there fails an open without full verification; a manifest of the older quick sha256 form still opens
    and still catches such a change."""
    import zlib

    from ctrkit.io import file_checksum

    path = make_store(tmp_path / "s")
    f = path / "c.npy"
    data = f.read_bytes()
    crc = zlib.crc32(data[-(1 << 20):], zlib.crc32(data[:1 << 20], zlib.crc32(str(len(data)).encode())))
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["columns"]["c"]["files"]["data"]["checksum"] == f"quick-crc32:{crc:08x}"
    changed = bytearray(data)
    changed[-5] ^= 1  # in the last MiB
    f.write_bytes(bytes(changed))
    with pytest.raises(StoreError, match="c.npy does not match its checksum"):
        Store(path, verify=False)
    f.write_bytes(data)
    manifest["columns"]["c"]["files"]["data"]["checksum"] = file_checksum(f)  # "quick:" + sha256, as before
    (path / "manifest.json").write_text(json.dumps(manifest))
    assert len(Store(path, verify=False)) == N
    f.write_bytes(bytes(changed))
    with pytest.raises(StoreError, match="c.npy does not match its checksum"):
        Store(path, verify=False)
