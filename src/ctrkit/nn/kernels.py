"""Native CPU kernels: C++ sources under ``nn/csrc`` built at first use with the system's C++ compiler, cached.

A kernel here is plain C++ on float / double arrays with ``extern "C"`` entry points, loaded with ctypes: no torch
headers, so a build takes seconds (a torch extension with ``torch/extension.h`` takes ~40 s on two cores). Every
caller keeps a pure-torch path and takes it when :func:`load` returns None: no compiler, a failed or timed-out
build, ``CTRKIT_NATIVE_KERNELS=0`` in the environment, or a platform other than Linux / macOS.

The build: ``$CXX`` (default ``g++``) ``-O3 -march=native -fopenmp -shared`` (again without OpenMP where the compiler
refuses it), each compile bounded by ``BUILD_TIMEOUT_S`` and a timeout ending the attempts; the
library goes to ``$CTRKIT_KERNEL_DIR`` (default ``~/.cache/ctrkit/kernels``, or under ``$XDG_CACHE_HOME``) under a
name that hashes the source (with the shared headers of csrc), the flags, the compiler's version and the CPU's flags, written to a temporary name and
renamed into place, so processes building at once (test workers, torchrun ranks) never load a partial file and a
library built for another CPU is never loaded.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

__all__ = ["BUILD_TIMEOUT_S", "I32", "I64", "PTR", "bind", "eager_cpu", "load"]

CSRC = Path(__file__).resolve().parent / "csrc"
BUILD_TIMEOUT_S = 180.0
_BASE_FLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-march=native")
# tried in order: the first that builds is kept (OpenMP where the compiler has it)
_EXTRA_FLAGS = (("-fopenmp",), ())
_lock = threading.Lock()
PTR, I32, I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64  # the C types of the entry points' arguments
SUFFIXES = ("f32", "f64")  # every kernel's entry points come per dtype: float, double


def cache_dir() -> Path:
    """Where built kernels live: ``$CTRKIT_KERNEL_DIR``, else ``$XDG_CACHE_HOME/ctrkit/kernels`` (``~/.cache``)."""
    if os.environ.get("CTRKIT_KERNEL_DIR"):
        return Path(os.environ["CTRKIT_KERNEL_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ctrkit" / "kernels"


def enabled() -> bool:
    """False where ``CTRKIT_NATIVE_KERNELS`` is 0 / false / no / off, or the platform has no kernel build here."""
    flag = os.environ.get("CTRKIT_NATIVE_KERNELS", "1").strip().lower()
    return flag not in ("0", "false", "no", "off") and sys.platform in ("linux", "darwin")


def load(name: str, flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The library built from ``csrc/<name>.cpp`` (built now if needed, then cached for the process), or None
    (logged once) where it cannot be built or kernels are disabled. ``flags``: compiler flags of this kernel after
    the common ones (e.g. ``-ffp-contract=off`` where results must round as torch's separate operations do)."""
    if not enabled():
        return None
    with _lock:
        return _load(name, tuple(flags))


def eager_cpu(*tensors: torch.Tensor) -> bool:
    """Whether a native autograd node may take ``tensors``: float32 / float64 CPU tensors of one dtype, outside
    autocast, ``torch.compile`` and ``torch.export`` (which must see the plain ops)."""
    t0 = tensors[0]
    return (t0.dtype in (torch.float32, torch.float64)
            and all(t.device.type == "cpu" and t.dtype == t0.dtype for t in tensors)
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling()
            and not torch.compiler.is_exporting())


def bind(name: str, symbols: dict[str, tuple[str, list[Any], Any]], flags: tuple[str, ...] = ()
         ) -> dict[str, Any] | None:
    """The entry points of :func:`load` ``(name, flags)`` with their C signatures, or None where it cannot be loaded.
    ``symbols``: ``{role: (C name, argtypes, restype)}``; each role is bound once per dtype suffix ``f32`` / ``f64``
    (the C function ``<C name>_<suffix>``), as ``{"<role>_<suffix>": function}``."""
    lib = load(name, flags)
    if lib is None:
        return None
    fns: dict[str, Any] = {}
    for role, (c_name, argtypes, restype) in symbols.items():
        for sfx in SUFFIXES:
            fn = getattr(lib, f"{c_name}_{sfx}")
            fn.argtypes, fn.restype = argtypes, restype
            fns[f"{role}_{sfx}"] = fn
    return fns


@functools.cache
def _load(name: str, own_flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    source = CSRC / f"{name}.cpp"
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        log.warning("native kernel %s: no C++ compiler (%s) on PATH; using the pure-torch path (set CXX to one)",
                    name, os.environ.get("CXX", "g++"))
        return None
    # the source and the shared headers it may include (a changed header must rebuild every kernel)
    text = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(CSRC.glob("*.h")))
    errors = []
    for extra in _EXTRA_FLAGS:
        flags = (*_BASE_FLAGS, *own_flags, *extra)
        lib = cache_dir() / f"{name}-{_digest(text, cxx, flags)}.so"
        try:
            if not lib.exists():
                _build(cxx, flags, source, lib)
            return ctypes.CDLL(str(lib))
        except (OSError, subprocess.SubprocessError) as e:
            errors.append(f"{' '.join(extra) or 'base flags'}: {_short(e)}")
            if isinstance(e, subprocess.TimeoutExpired):
                break  # one bounded wait in all, not one per set of flags
    log.warning("native kernel %s: could not build %s with %s (%s); using the pure-torch path",
                name, source, cxx, "; ".join(errors))
    return None


def _build(cxx: str, flags: tuple[str, ...], source: Path, lib: Path) -> None:
    lib.parent.mkdir(parents=True, exist_ok=True)
    log.info("building native kernel %s (once; cached as %s)", source.name, lib)
    fd, tmp = tempfile.mkstemp(prefix=lib.stem, suffix=".tmp", dir=lib.parent)
    os.close(fd)
    try:
        subprocess.run([cxx, *flags, "-o", tmp, str(source)], check=True, capture_output=True, text=True,
                       timeout=BUILD_TIMEOUT_S)
        os.replace(tmp, lib)  # atomic: a concurrent loader sees no file or the whole one
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _digest(text: bytes, cxx: str, flags: tuple[str, ...]) -> str:
    h = hashlib.sha256(text)
    h.update(" ".join((cxx, *flags)).encode())
    try:
        h.update(subprocess.run([cxx, "--version"], check=False, capture_output=True, timeout=30).stdout)
    except (OSError, subprocess.SubprocessError):
        pass
    h.update(_cpu_flags().encode())  # -march=native: a library is only valid on the CPU kind that built it
    return h.hexdigest()[:16]


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        import platform

        return platform.processor() + platform.machine()


def _short(e: BaseException) -> str:
    if isinstance(e, subprocess.CalledProcessError):
        tail = (e.stderr or "").strip().splitlines()[-3:]
        return f"exit {e.returncode}: {' | '.join(tail)}"
    if isinstance(e, subprocess.TimeoutExpired):
        return f"no result within {BUILD_TIMEOUT_S:.0f} s"
    return str(e)
