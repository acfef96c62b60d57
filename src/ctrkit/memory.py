"""Keep freed tensor / array memory in the process instead of returning it to the OS after every step.

PyTorch on CPU allocates through the C library's ``malloc``. glibc serves large blocks with fresh
``mmap`` calls (above a dynamic threshold of at most 32 MB) and trims the heap top once more than
twice that threshold is free, so the big activations of a training step (a CIN layer's Hadamard
maps, a wide MLP's batch) are handed back to the kernel at the end of each step and page-faulted in
again, zero-filled, at the next one. On this project's reference VM (a Firecracker guest) that
costs about 2.6 µs per 4 KiB page: ``python benchmarks/alloc_reuse.py`` measured four fresh 100 MB
blocks at 261–348 ms against 30–36 ms reused from the heap. On whole training runs it took an
xDeepFM Criteo fit from 6.2 s to 4.6 s; a lone CIN forward + backward, repeated in one process,
measured 0.93–1.29x over twelve runs, i.e. within noise.

:func:`keep_freed_memory` raises glibc's mmap threshold and trim threshold (``mallopt``) so that
blocks up to ``threshold`` bytes come from, and return to, the heap and stay mapped: every step
after the first reuses the previous step's pages. This is the steady-state behaviour PyTorch's CPU
tuning guide gets by preloading jemalloc or tcmalloc, without the preload. The cost is that the
process keeps its peak heap resident after a step instead of shrinking between steps.

The setting is process-wide and only acts on Linux with glibc; elsewhere it is a logged no-op.
``TrainConfig.keep_freed_memory`` (default true) turns it on at the start of a ``ctrkit train`` job
(:mod:`ctrkit.jobs.train`); the :class:`~ctrkit.training.trainer.Trainer` does not touch it, so a program
that trains through the Trainer keeps its allocator as it set it (and calls this function if it wants it).
``ctrkit preprocess criteo`` turns it on too (:func:`ctrkit.data.sources.criteo.run_preprocess_criteo`): every
block of lines allocates the same few-MB arrays, which glibc would otherwise hand back and fault in again,
zero-filled (on the 4-day 1M-row benchmark, ~0.3 of ~0.8 system CPU-s per run);
:func:`~ctrkit.data.sources.criteo.preprocess_criteo` itself leaves the allocator as its caller set it.

:func:`numpy_huge_pages` switches numpy's own advice off: numpy asks the kernel for transparent huge pages
(``madvise(MADV_HUGEPAGE)``) on every array of 4 MB or more, and where the kernel's THP defrag setting is
``madvise`` (this VM's) a first touch of such an array compacts memory and zeroes a whole 2 MB page in the
faulting thread. ``ctrkit preprocess criteo`` turns it off (its arrays are a few MB and short-lived, read once
or twice): on the 4-day 1M-row benchmark, system CPU fell from 0.66-1.09 to 0.26-0.37 s per run with about
50% more (4 KiB) minor faults (alternating runs at load 9-10; ``NUMPY_MADVISE_HUGEPAGE=0``, the same switch).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import logging
import platform

log = logging.getLogger(__name__)

__all__ = ["keep_freed_memory", "numpy_huge_pages"]

_M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
_M_MMAP_THRESHOLD = -3
_DONE: set[int] = set()


def freed_memory_thresholds(threshold: int = 1 << 30) -> tuple[int, int]:
    """(mmap threshold, trim threshold) in bytes that :func:`keep_freed_memory` gives glibc for ``threshold``:
    the trim threshold twice the mmap one, glibc's own dynamic rule, both capped to a C int (mallopt's type)."""
    return min(threshold, 2**31 - 1), min(2 * threshold, 2**31 - 1)


def keep_freed_memory(threshold: int = 1 << 30) -> bool:
    """Serve allocations below ``threshold`` bytes from the heap and never trim it below that much free.

    Returns True when glibc accepted both settings, False when this is not glibc (nothing changed).
    Idempotent for a given threshold.
    """
    if threshold < 1 << 20:
        raise ValueError(f"keep_freed_memory: threshold must be >= 1 MiB, got {threshold} bytes")
    if threshold in _DONE:
        return True
    libc_name = platform.libc_ver()[0]
    if platform.system() != "Linux" or libc_name != "glibc":
        log.info("keep_freed_memory: not Linux/glibc (%s %s); allocator left as is", platform.system(), libc_name)
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    # glibc keeps a freed block mapped while the heap top holds < trim threshold of free memory
    mmap, trim = freed_memory_thresholds(threshold)
    ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(mmap))) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, ctypes.c_int(trim))
    )
    if ok:
        _DONE.add(threshold)
        log.info("keep_freed_memory: glibc mmap threshold %d MiB, trim threshold %d MiB", mmap >> 20, trim >> 20)
    else:
        log.warning("keep_freed_memory: glibc refused mallopt(%d bytes); allocator left as is", threshold)
    return ok


def numpy_huge_pages(enabled: bool) -> bool | None:
    """Let numpy advise transparent huge pages for its new large arrays (``enabled``) or not, process-wide (the
    module docstring) -> the previous setting, or None (logged) where this numpy has no such switch."""
    switch = None
    for where in ("numpy._core.multiarray", "numpy.core.multiarray"):  # numpy 2 / numpy 1
        try:
            switch = getattr(importlib.import_module(where), "_set_madvise_hugepage", None)
        except ImportError:
            continue
        if switch is not None:
            break
    if switch is None:
        log.info("numpy_huge_pages: this numpy has no huge-page switch; left as is")
        return None
    return bool(switch(bool(enabled)))
