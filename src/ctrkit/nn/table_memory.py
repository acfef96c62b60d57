"""Refuse embedding tables that cannot fit in memory before allocating them.

``torch.empty(rows, dim)`` for a table larger than the machine's memory either fails deep inside the allocator
("DefaultCPUAllocator: can't allocate memory") or, with overcommit, succeeds and gets the process killed at the
first touch of the pages (initialisation), with nothing said. :func:`check_tables_fit` compares the tables' float32
size with the memory available now (``MemAvailable``, or the cgroup's limit when lower) and names the largest tables
and the options that shrink them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ctrkit.errors import LayerConfigError

log = logging.getLogger(__name__)

GiB = 2**30


def available_memory() -> int | None:
    """Bytes of memory this process can still get: /proc/meminfo's MemAvailable, capped by the cgroup v2 limit
    (``memory.max - memory.current``); None where neither can be read."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None and hasattr(os, "sysconf"):
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            room = max(int(limit) - used, 0)
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail


def check_tables_fit(tables: Iterable[Any], bytes_per_value: int = 4) -> None:
    """Raise :class:`LayerConfigError` when the tables (``TableSpec``: name, num_embeddings, embedding_dim) need
    more memory than is available; warn when they fit but an optimizer state of the same size would not."""
    tables = list(tables)
    need = sum(t.num_embeddings * t.embedding_dim for t in tables) * bytes_per_value
    avail = available_memory()
    if avail is None or need <= avail // 2:
        return
    largest = sorted(tables, key=lambda t: t.num_embeddings * t.embedding_dim, reverse=True)[:3]
    parts = ", ".join(f"{t.name}: {t.num_embeddings:,} rows x {t.embedding_dim} = "
                      f"{t.num_embeddings * t.embedding_dim * bytes_per_value / GiB:.2f} GiB" for t in largest)
    sizes = f"the embedding tables need {need / GiB:.2f} GiB (largest: {parts})"
    if need > avail:
        raise LayerConfigError(
            f"{sizes} but this machine has {avail / GiB:.2f} GiB of memory available. Make them smaller: a lower "
            "embedding dim (model.params.embedding_dim / embedding_dims), or fewer rows (a higher minimum id "
            "frequency when preprocessing maps the rare ids to one shared row)")
    log.warning("%s of the %.2f GiB available; the sparse optimizer's state (Adagrad: one value per weight) may not "
                "fit beside them. Lower the embedding dimension or the rows per table if training runs out of memory",
                sizes, avail / GiB)
