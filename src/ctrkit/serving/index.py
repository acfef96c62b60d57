"""Vector recall: a faiss index over item vectors, searched top-k per query with seen items excluded.

Letters: N indexed items, Q queries, D vector dimension, k results per query.

Kinds: ``flat_ip`` / ``flat_l2`` (exact), ``ivf`` (IndexIVFFlat: k-means lists, ``nprobe`` of them scanned)
and ``hnsw`` (IndexHNSWFlat graph, ``ef_search`` candidates kept). Scores are higher-is-better: the inner
product for metric ``ip``, the negative squared L2 distance for ``l2``. faiss works on positions 0..N-1;
``ids`` (N,) maps them back to item ids. Items to exclude per query come as one id list per query or as
(query row, item id) pairs, the form :meth:`ctrkit.retrieval.catalogue.SeenItems.pairs` returns.

A saved index is a directory: ``index.faiss`` (faiss.write_index), ``ids.npy`` and ``index.json`` (kind,
metric, dim, count, fingerprint of the checkpoint the vectors came from, search parameters).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.errors import ConfigError, RetrievalError

log = logging.getLogger(__name__)

INDEX_KINDS = ("flat_ip", "flat_l2", "ivf", "hnsw")
METRICS = ("ip", "l2")
FILES = ("index.faiss", "ids.npy", "index.json")
# a list of item ids per query, or a tuple (query rows (P,), item ids (P,)) of pairs; never a tuple of lists
Exclude = Sequence[Sequence[int]] | tuple[np.ndarray, np.ndarray] | None


def _faiss() -> Any:
    quiet_faiss_loader()
    try:
        import faiss
    except ImportError as e:  # an optional dependency
        raise ImportError("ctrkit.retrieval needs faiss: pip install 'ctrkit[retrieval]' (faiss-cpu)") from e
    return faiss


def quiet_faiss_loader() -> None:
    """faiss's loader logs at INFO each instruction set it tries and cannot load ("Could not load library with
    AVX512 support due to: ModuleNotFoundError ..."): normal on most machines, yet it reads like an error. Those
    lines show only with debug logging (``ctrkit -v``) or when the caller set the ``faiss.loader`` level."""
    loader = logging.getLogger("faiss.loader")
    if loader.level == logging.NOTSET and not logging.getLogger().isEnabledFor(logging.DEBUG):
        loader.setLevel(logging.WARNING)


def default_nlist(n: int) -> int:
    """IVF lists for N vectors: 4*sqrt(N), the low end of the faiss wiki's 4..16*sqrt(N) ("Guidelines to
    choose an index"), at most N // 39 so k-means gets the 39 training points per list faiss asks for."""
    return max(1, min(round(4 * math.sqrt(n)), n // 39))


class VectorIndex:
    """A faiss index over N item vectors and the item ids of its rows; build with :meth:`build`."""

    def __init__(self, index: Any, ids: np.ndarray, meta: dict[str, Any]) -> None:
        self.index, self.ids, self.meta = index, ids, meta
        order = np.argsort(ids, kind="stable")
        self._sorted_ids, self._sorted_pos = ids[order], order  # item id -> position lookups for exclusion
        self.set_search_params(nprobe=meta.get("nprobe"), ef_search=meta.get("ef_search"))

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def build(cls, vectors: np.ndarray, ids: np.ndarray, *, kind: str = "flat_ip", metric: str | None = None,
              nlist: int | None = None, nprobe: int = 16, hnsw_m: int = 32, ef_construction: int = 200,
              ef_search: int = 128, fingerprint: str = "", seed: int = 0) -> VectorIndex:
        """Index ``vectors`` (N, D) whose rows are the items ``ids`` (N,) int64.

        ``metric`` is implied by flat kinds and defaults to ``ip`` for ivf / hnsw. IVF trains k-means on a
        seeded sample of at most 64 * nlist vectors (the wiki asks for 30..256 per list); ``nlist``
        defaults to :func:`default_nlist`. ``fingerprint`` names the checkpoint the vectors came from
        (checked on load). Logs the build seconds.
        """
        faiss = _faiss()
        if kind not in INDEX_KINDS:
            raise ConfigError(f"kind={kind!r} is not an index kind; choose one of {', '.join(INDEX_KINDS)}")
        implied = {"flat_ip": "ip", "flat_l2": "l2"}.get(kind)
        if implied and metric not in (None, implied):
            raise ConfigError(f"metric={metric!r} contradicts kind={kind!r}; drop metric or use "
                              f"kind=flat_{metric}")
        metric = implied or metric or "ip"
        if metric not in METRICS:
            raise ConfigError(f"metric={metric!r} is not supported; choose one of {', '.join(METRICS)}")
        x = np.ascontiguousarray(vectors, dtype=np.float32)
        ids = np.asarray(ids)
        if x.ndim != 2 or len(x) == 0 or ids.shape != (len(x),) or ids.dtype.kind not in "iu":
            raise RetrievalError(f"need vectors (N, D) with N >= 1 and integer ids (N,); got vectors "
                                 f"{x.shape}, ids {ids.shape} {ids.dtype}")
        ids = ids.astype(np.int64)
        if len(np.unique(ids)) != len(ids):
            raise RetrievalError("ids has duplicates: each row of vectors must be a different item")
        if not np.isfinite(x).all():
            raise RetrievalError("vectors has NaN or inf entries: the checkpoint's item tower diverged")
        n, d = x.shape
        mt = faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2
        meta: dict[str, Any] = {"kind": kind, "metric": metric, "dim": d, "count": n,
                                "fingerprint": fingerprint}
        t0 = time.perf_counter()
        if kind.startswith("flat"):
            index = faiss.IndexFlatIP(d) if metric == "ip" else faiss.IndexFlatL2(d)
        elif kind == "ivf":
            nlist = default_nlist(n) if nlist is None else nlist
            if not 1 <= nlist <= n:
                raise ConfigError(f"nlist={nlist} must lie in [1, N={n}]; leave it unset for the faiss rule")
            quantizer = faiss.IndexFlatIP(d) if metric == "ip" else faiss.IndexFlatL2(d)
            index = faiss.IndexIVFFlat(quantizer, d, nlist, mt)
            index.cp.seed = seed
            rng = np.random.default_rng(seed)
            sample = x if n <= 64 * nlist else x[np.sort(rng.choice(n, 64 * nlist, replace=False))]
            index.train(sample)
            meta.update(nlist=nlist, nprobe=nprobe)
        else:
            index = faiss.IndexHNSWFlat(d, hnsw_m, mt)
            index.hnsw.efConstruction = ef_construction
            meta.update(hnsw_m=hnsw_m, ef_construction=ef_construction, ef_search=ef_search)
        index.add(x)
        log.info("built %s index of %d x %d in %.2f s", kind, n, d, time.perf_counter() - t0)
        return cls(index, ids, meta)

    def set_search_params(self, *, nprobe: int | None = None, ef_search: int | None = None) -> None:
        """Lists scanned per query (ivf) / candidates kept in the graph walk (hnsw): recall against speed."""
        faiss = _faiss()
        if nprobe is not None and self.meta["kind"] == "ivf":
            faiss.extract_index_ivf(self.index).nprobe = self.meta["nprobe"] = int(nprobe)
        if ef_search is not None and self.meta["kind"] == "hnsw":
            faiss.downcast_index(self.index).hnsw.efSearch = self.meta["ef_search"] = int(ef_search)

    def search(self, queries: np.ndarray, k: int, exclude: Exclude = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` items per query of ``queries`` (Q, D) -> (scores (Q, k) float32, ids (Q, k) int64).

        ``exclude`` gives per query the item ids never to return (items seen in training): a list of ids
        per query, or a tuple (query rows (P,), item ids (P,)) as ``SeenItems.pairs`` returns. Rows with fewer
        than k items left are padded with id -1 and score -inf. Exclusion costs one search of k + the longest
        exclusion list candidates per query, filtered in numpy on sorted keys q * N + position.
        """
        n = len(self)
        if k < 1 or k > n:
            raise RetrievalError(f"k={k} but the index holds {n} items; lower --k to between 1 and {n}")
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.dim:
            got = f"D={q.shape[1]}" if q.ndim == 2 else f"shape {q.shape}"
            raise RetrievalError(f"index built for D={self.dim}, queries have {got}: the index belongs to "
                                 "another model/checkpoint; rebuild it")
        nq = len(q)
        excl_keys = self._exclusion_keys(exclude, nq)  # sorted q * N + position, (nnz,)
        per_query = np.bincount(excl_keys // n, minlength=nq) if len(excl_keys) else np.zeros(nq, np.int64)
        width = min(n, k + int(per_query.max(initial=0)))
        dist, pos = self.index.search(q, width)  # (Q, width) each
        keep = pos >= 0  # faiss marks missing results with -1
        if len(excl_keys):
            keys = np.arange(nq, dtype=np.int64)[:, None] * n + pos  # (Q, width)
            hit = np.searchsorted(excl_keys, keys).clip(max=len(excl_keys) - 1)
            keep &= excl_keys[hit] != keys
        order = np.argsort(~keep, axis=1, kind="stable")[:, :k]  # kept candidates first, faiss's order kept
        pos, dist, keep = (np.take_along_axis(a, order, axis=1) for a in (pos, dist, keep))
        scores = dist if self.meta["metric"] == "ip" else -dist
        scores = np.where(keep, scores, -np.inf).astype(np.float32)
        return scores, np.where(keep, self.ids[pos.clip(min=0)], -1)

    def _exclusion_keys(self, exclude: Exclude, nq: int) -> np.ndarray:
        """Sorted unique keys q * N + position of the indexed items excluded for query q (unknown ids
        dropped), from per-query id lists or (row, item id) pairs."""
        if exclude is None:
            return np.zeros(0, np.int64)
        if isinstance(exclude, tuple):  # (row, item id) pairs
            row, items = (np.asarray(a, np.int64) for a in exclude) if len(exclude) == 2 else (None, None)
            if row is None or row.shape != items.shape or row.ndim != 1 or ((row < 0) | (row >= nq)).any():
                raise RetrievalError(f"exclude as a tuple must be (query rows (P,), item ids (P,)) pairs "
                                     f"with rows in [0, {nq}); give per-query lists of seen ids as a list")
        else:
            if len(exclude) != nq:
                raise RetrievalError(f"exclude has {len(exclude)} rows for {nq} queries; give one list of "
                                     "seen item ids per query")
            lengths = np.fromiter(map(len, exclude), np.int64, count=nq)
            row = np.repeat(np.arange(nq, dtype=np.int64), lengths)
            items = np.concatenate([np.asarray(e, np.int64) for e in exclude]) if len(row) else row
        at = np.searchsorted(self._sorted_ids, items).clip(max=len(self) - 1)
        found = self._sorted_ids[at] == items
        return np.unique(row[found] * len(self) + self._sorted_pos[at[found]])

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the index directory at ``path`` atomically (a temporary directory, then a rename)."""
        faiss, path = _faiss(), Path(path)
        if path.exists() and not overwrite:
            raise RetrievalError(f"{path} already exists; choose another path or pass overwrite=True "
                                 "(--overwrite)")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp, old = (path.with_name(f".{path.name}.{tag}-{os.getpid()}") for tag in ("tmp", "old"))
        try:
            tmp.mkdir()
            faiss.write_index(self.index, str(tmp / FILES[0]))
            np.save(tmp / FILES[1], self.ids)
            size = (tmp / FILES[0]).stat().st_size  # load() checks it: a truncated copy is refused by name
            (tmp / FILES[2]).write_text(json.dumps({**self.meta, "bytes": size}, indent=1))
            if path.exists():  # overwrite: move the old one aside, so path never holds a half-written index
                os.replace(path, old)
            os.replace(tmp, path)
        except BaseException:
            if old.exists() and not path.exists():  # put the old index back
                os.replace(old, path)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)
        return path

    @classmethod
    def load(cls, path: str | Path, *, expect_dim: int | None = None,
             expect_fingerprint: str | None = None) -> VectorIndex:
        """Read an index written by :meth:`save`; check it fits the model (``expect_dim``) and checkpoint."""
        faiss, path = _faiss(), Path(path)
        missing = [f for f in FILES if not (path / f).is_file()]
        if missing:
            raise RetrievalError(f"{path} is not a saved index (missing {', '.join(missing)}); build one "
                                 "with VectorIndex.build(...).save(path)")
        meta = _read_meta(path)
        if expect_fingerprint is not None and meta["fingerprint"] != expect_fingerprint:
            built = meta["fingerprint"] or "<none>"
            raise RetrievalError(f"index at {path} was built from checkpoint {built}, this is "
                                 f"{expect_fingerprint}; rebuild it from this checkpoint's item vectors")
        if expect_dim is not None and meta["dim"] != expect_dim:
            raise RetrievalError(f"index at {path} holds D={meta['dim']} vectors, the model has "
                                 f"D={expect_dim}: it belongs to another model/checkpoint; rebuild it")
        index, ids = _read_arrays(faiss, path, meta.pop("bytes", None))
        if index.ntotal != len(ids) or index.ntotal != meta["count"] or index.d != meta["dim"]:
            raise RetrievalError(f"{path} is inconsistent ({index.ntotal} vectors, {len(ids)} ids, "
                                 f"index.json says {meta['count']}); rebuild it")
        return cls(index, ids, meta)


REBUILD = "rebuild it (ctrkit recall --index-path PATH --overwrite, or remove it)"


def _read_meta(path: Path) -> dict[str, Any]:
    """index.json of the saved index ``path``: a RetrievalError naming it when it cannot be read."""
    try:
        meta = json.loads((path / FILES[2]).read_text())
        if not isinstance(meta, dict):
            raise TypeError("not a JSON object")
        meta["dim"], meta["count"] = int(meta["dim"]), int(meta["count"])
        meta.setdefault("fingerprint", None)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise RetrievalError(f"{path / FILES[2]} cannot be read ({type(e).__name__}: {e}); {REBUILD}") from None
    return meta


def _read_arrays(faiss: Any, path: Path, size: int | None) -> tuple[Any, np.ndarray]:
    """The faiss index and the ids of the saved index ``path``; a truncated or damaged file is a RetrievalError
    naming it (faiss's own error is a RuntimeError from its C++ reader)."""
    file = path / FILES[0]
    if size is not None and file.stat().st_size != size:
        raise RetrievalError(f"{file} holds {file.stat().st_size} bytes, index.json says {size}: the file is "
                             f"truncated or damaged; {REBUILD}")
    try:
        index = faiss.read_index(str(file))
    except Exception as e:  # noqa: BLE001 - faiss raises RuntimeError (and others) for a bad file
        first = (str(e).strip().splitlines() or [""])[-1]
        raise RetrievalError(f"{file} cannot be read by faiss (truncated or damaged: {first}); {REBUILD}") from None
    try:
        ids = np.load(path / FILES[1], allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise RetrievalError(f"{path / FILES[1]} cannot be read ({e}); {REBUILD}") from None
    return index, ids
