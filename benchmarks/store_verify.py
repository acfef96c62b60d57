"""Cost of verifying a store's whole content (CRC-32 of every column, :mod:`ctrkit.data.storage.verify`).

Writes a synthetic Criteo-shaped store (label + 13 dense float32 + 26 sparse int32; default 2M rows, 320 MB)
into a temporary directory, then times, with the files in the page cache (so the figures are the CPU cost; a
cold disk bounds both verification and training's first epoch the same way):

* ``crc32_mb_s`` / ``sha256_mb_s``: the hash functions alone over the store's bytes in memory;
* ``write_s`` and ``write_crc_share``: writing the store, and the share of it the streaming CRC takes;
* ``open_quick_s``: opening with ``verify=False`` (size + first / last MiB, the check before);
* ``open_verify_s`` / ``verify_mb_s`` (threads: all cores, up to 8) and ``verify_1_thread_mb_s``: opening
  when nothing is recorded yet (a copied store), i.e. reading and checking every byte;
* ``open_recorded_s``: opening again (the files unchanged: a stat per file);
* ``epoch_s``: one pass of the batch loader over the store (batch 4096, no shuffle), what training reads anyway.

Prints one JSON line.

    python benchmarks/store_verify.py [--rows 2000000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
import zlib
from pathlib import Path

from ctrkit.data.sources.synthetic import write_synthetic_store
from ctrkit.data.storage import verify
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store


def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def hash_times(files: list[Path]) -> tuple[float, float]:
    """Seconds of zlib.crc32 and hashlib.sha256 over the files' bytes, in memory."""
    blobs = [f.read_bytes() for f in files]
    crc_s, _ = timed(lambda: [zlib.crc32(b) for b in blobs])
    sha_s, _ = timed(lambda: [hashlib.sha256(b).digest() for b in blobs])
    return crc_s, sha_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="ctrkit-verify-") as tmp:
        path = Path(tmp) / "store"
        write_s, _ = timed(lambda: write_synthetic_store(path, args.rows, seed=0))
        files = sorted(path.glob("*.npy"))
        size = sum(f.stat().st_size for f in files)
        crc_s, sha_s = hash_times(files)
        quick_s = min(timed(lambda: Store(path, verify=False))[0] for _ in range(3))  # best of 3: a shared machine
        (path / verify.CACHE).unlink()
        verify_s, _ = timed(lambda: Store(path))
        recorded_s = min(timed(lambda: Store(path))[0] for _ in range(3))
        store = Store(path)
        parts = [verify.Part(f, 128, "") for f in files]
        one_s, _ = timed(lambda: [verify.content_checksum(q.path, q.offset) for q in parts])
        epoch_s, _ = timed(lambda: sum(len(b) for b in BatchLoader(store, 4096, shuffle=False, prefetch=0)))
    mb = size / 1e6
    print(json.dumps({
        "rows": args.rows, "store_mb": round(mb, 1), "files": len(files),
        "crc32_mb_s": round(mb / crc_s), "sha256_mb_s": round(mb / sha_s),
        "write_s": round(write_s, 2), "write_crc_share": round(crc_s / write_s, 3),
        "open_quick_s": round(quick_s, 3), "open_verify_s": round(verify_s, 3), "verify_mb_s": round(mb / verify_s),
        "verify_1_thread_mb_s": round(mb / one_s), "open_recorded_s": round(recorded_s, 4),
        "epoch_s": round(epoch_s, 2), "verify_vs_epoch": round(verify_s / epoch_s, 3),
    }))


if __name__ == "__main__":
    main()
