"""ctrkit.memory.keep_freed_memory: glibc serves big tensors from the heap afterwards; Trainer wiring.
ctrkit.memory.numpy_huge_pages: numpy's huge-page advice switched and the previous setting returned."""

from __future__ import annotations

import ctypes
import platform

import pytest
import torch

from ctrkit import memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mallinfo() -> _MallInfo2:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2()


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_big_tensors_come_from_the_heap_after_keep_freed_memory():
    assert memory.keep_freed_memory() is True
    assert memory.keep_freed_memory() is True  # idempotent
    mapped = _mallinfo().hblkhd
    x = torch.empty(64 << 18)  # 64 MiB: above glibc's largest dynamic mmap threshold (32 MiB)
    x.fill_(1.0)
    info = _mallinfo()
    assert info.hblkhd - mapped < 64 << 20, "the 64 MiB block was mmapped, not taken from the heap"
    assert info.uordblks >= 64 << 20
    del x
    assert _mallinfo().arena >= 64 << 20, "the heap was trimmed right after the free"


def test_not_glibc_is_a_no_op(monkeypatch):
    monkeypatch.setattr(memory.platform, "libc_ver", lambda: ("", ""))
    assert memory.keep_freed_memory(threshold=3 << 20) is False


def test_threshold_below_one_mib_is_an_error():
    with pytest.raises(ValueError, match="threshold must be >= 1 MiB"):
        memory.keep_freed_memory(threshold=1000)


def test_numpy_huge_pages_switches_and_returns_the_previous_setting():
    from numpy._core import multiarray

    before = multiarray._get_madvise_hugepage()
    try:
        assert memory.numpy_huge_pages(False) is before
        assert multiarray._get_madvise_hugepage() is False
        assert memory.numpy_huge_pages(True) is False
        assert multiarray._get_madvise_hugepage() is True
    finally:
        multiarray._set_madvise_hugepage(before)
