"""Shared fixtures: a small schema with every kind of feature and batches with a planted signal."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.schema import DenseFeature, Schema, SequenceFeature, SparseFeature

REPO = Path(__file__).resolve().parents[1]
# The shared data sets (MovieLens, Taobao, S3-Rec, ...), too big for the repository: the folder named by this
# variable, else shared/data beside the checkout (../shared/data). Tests reach them only through the
# ``shared_data`` fixture below.
SHARED_DATA_VAR = "CTRKIT_SHARED_DATA"


def shared_data_root() -> tuple[Path, bool]:
    """(the shared data folder, whether the environment variable named it)."""
    named = os.environ.get(SHARED_DATA_VAR)
    return (Path(named), True) if named else (REPO.parent / "shared" / "data", False)


def pytest_report_header() -> str:
    root, named = shared_data_root()
    where = f"{root} (from ${SHARED_DATA_VAR})" if named else f"{root} (set ${SHARED_DATA_VAR} to use another)"
    if root.is_dir():
        return f"shared data: {where}"
    return f"shared data: {where} is absent: the tests that read it are skipped"


# Optional extras (pyproject.toml): a test that needs one is skipped, with the extra to install, where its
# module is absent (a machine without the extras, say a GPU box with its own torch), unless this variable is "1":
# .ci/run sets it, so CI, which installs every extra, fails instead of skipping.
REQUIRE_EXTRAS_VAR = "CTRKIT_REQUIRE_EXTRAS"
# registered models whose code needs an extra: their parametrized test cases skip with it
MODEL_EXTRAS = {"gbdt_lr": ("lightgbm", "gbdt")}


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` of the optional extra ``ctrkit[extra]``, or skip the calling test module (see above)."""
    if os.environ.get(REQUIRE_EXTRAS_VAR) == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"needs the optional extra ctrkit[{extra}] ({module})")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(REQUIRE_EXTRAS_VAR) == "1":
        return
    for model, (module, extra) in MODEL_EXTRAS.items():
        if importlib.util.find_spec(module) is not None:
            continue
        mark = pytest.mark.skip(reason=f"{model} needs the optional extra ctrkit[{extra}] ({module})")
        for item in items:
            if model in item.nodeid:
                item.add_marker(mark)


def find_shared(relative: str, root: Path, named: bool) -> Path:
    """``root / relative``; skips the test only when the whole shared folder is absent (a clean clone without
    ../shared) and the variable is unset. A folder named by the variable that does not exist, or a file missing
    from a folder that does, fails the test: a silent skip there would hide a broken set-up."""
    if not root.is_dir():
        if named:
            pytest.fail(f"${SHARED_DATA_VAR}={root} is not a folder")
        pytest.skip(f"shared data folder {root} absent (set ${SHARED_DATA_VAR} to a copy of shared/data)")
    path = root / relative
    if not path.exists():
        pytest.fail(f"{relative} is missing from the shared data folder {root} (${SHARED_DATA_VAR})")
    return path


@pytest.fixture(scope="session")
def shared_data() -> Callable[[str], Path]:
    """``shared_data("movielens_100k")``: a file or folder of the shared data sets (see ``find_shared``)."""
    root, named = shared_data_root()
    return lambda relative: find_shared(relative, root, named)

DIM = 8


def benchmark_module(name: str) -> ModuleType:
    """benchmarks/<name>.py imported as module ``name`` (the benchmarks folder is not a package)."""
    path = REPO / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod

# Test tensors are tiny: one intra-op thread is faster and immune to OpenMP spin-waits on a busy machine.
torch.set_num_threads(1)
# Some tests step torch's sparse optimizers directly (references next to ctrkit's OptimizerSet, which opts out
# itself); say explicitly what torch does by default, so they print no "implicitly disabled" warning.
# (tests/training/test_optim.py checks ctrkit's own paths in fresh interpreters, unaffected by this.)
torch.sparse.check_sparse_tensor_invariants.disable()


def contract_schema() -> Schema:
    """3 dense, 4 single-valued sparse (user / item groups), a multi-valued tag and an item history."""
    return Schema(
        dense=[DenseFeature("d0"), DenseFeature("d1"), DenseFeature("d2")],
        sparse=[
            SparseFeature("user", 50, DIM, group="user"),
            SparseFeature("item", 40, DIM, group="item"),
            SparseFeature("cat", 12, DIM, group="item"),
            SparseFeature("ctx", 6, DIM, group="context"),
            SparseFeature("tags", 20, DIM, group="item", multi_valued=True, pooling="mean"),
        ],
        sequence=[SequenceFeature("hist_item", 6, shares="item", pooling="mean")],
    )


def behaviour_schema(sessions: int = 2, session_len: int = 3) -> Schema:
    """The contract schema's fields plus what the behaviour builder writes: unpooled histories of items and
    their categories (hist_item, hist_cat), DIEN's sampled negatives (neg_hist_*) and DSIN's sessions
    (sess_<k>_item / sess_<k>_cat)."""
    s = contract_schema()
    seqs = [SequenceFeature("hist_item", 6, shares="item", pooling="none"),
            SequenceFeature("hist_cat", 6, shares="cat", pooling="none"),
            SequenceFeature("neg_hist_item", 6, shares="item", pooling="none"),
            SequenceFeature("neg_hist_cat", 6, shares="cat", pooling="none")]
    for k in range(sessions):
        seqs += [SequenceFeature(f"sess_{k}_item", session_len, shares="item", pooling="none"),
                 SequenceFeature(f"sess_{k}_cat", session_len, shares="cat", pooling="none")]
    return Schema(dense=s.dense, sparse=s.sparse, sequence=seqs)


def _sibling(name: str, out: dict) -> str | None:
    """The sequence of the same behaviours already drawn: hist_item for hist_cat, sess_0_item for sess_0_cat."""
    stem = name.rsplit("_", 1)[0] + "_"
    for key in out:
        if key.endswith(".lengths") and key.startswith(stem) and key.count("_") == name.count("_"):
            return key.removesuffix(".lengths")
    return None


def planted_data(n: int, seed: int = 0, schema: Schema | None = None) -> dict[str, np.ndarray]:
    """Rows whose label follows a logistic model of one dense value and two id properties."""
    schema = schema or contract_schema()
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    dense = rng.normal(size=(n, schema.num_dense)).astype(np.float32)
    out["dense"] = dense
    for f in schema.sparse:
        if f.multi_valued:
            lengths = rng.integers(0, 4, n)
            out[f.name + ".lengths"] = lengths
            out[f.name] = rng.integers(2, f.vocab_size, lengths.sum())
        else:
            out[f.name] = rng.integers(2, f.vocab_size, n)
    for q in schema.sequence:
        vocab = schema.feature(q.shares).vocab_size
        paired = q.name.removeprefix("neg_") if q.name.startswith("neg_") else None
        # attributes of the same behaviours (hist_cat beside hist_item, neg_hist_item, a session's sess_k_cat)
        # have the lengths of the sequence they describe
        same = paired if paired in out else _sibling(q.name, out)
        lengths = out[same + ".lengths"] if same else rng.integers(0, q.max_len + 1, n)
        out[q.name + ".lengths"] = lengths
        out[q.name] = rng.integers(2, vocab, lengths.sum())
    logit = 1.5 * dense[:, 0] + 2.0 * (out["item"] % 2 == 0) - 2.0 * (out["user"] % 3 == 0) - 0.3
    out["label"] = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return out


def make_batch(data: dict[str, np.ndarray], rows: np.ndarray | slice, schema: Schema | None = None) -> Batch:
    """Slice rows out of ``planted_data`` into a Batch (KeyedJagged in the schema's key order)."""
    schema = schema or contract_schema()
    idx = np.arange(len(data["label"]))[rows]
    per_key = {}
    for key in schema.sparse_keys:
        if key + ".lengths" in data:
            lengths = data[key + ".lengths"]
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            vals = np.concatenate([data[key][offsets[i]:offsets[i + 1]] for i in idx]) if len(idx) else []
            per_key[key] = (torch.as_tensor(np.asarray(vals, dtype=np.int64)), torch.as_tensor(lengths[idx]))
        else:
            per_key[key] = (torch.as_tensor(data[key][idx]), torch.ones(len(idx), dtype=torch.int64))
    return Batch(
        dense=torch.as_tensor(data["dense"][idx]),
        sparse=KeyedJagged.from_per_key(per_key),
        labels=torch.as_tensor(data["label"][idx]),
    )


class ListLoader(list):
    """A list of batches as the Trainer's loader (fixed order, nothing to resume)."""

    def set_epoch(self, epoch: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@pytest.fixture
def schema() -> Schema:
    return contract_schema()


def write_log(path, n_users=30, n_items=25, per_user=7, seed=0):
    """A CSV behaviour log: user, item, cat (item % 4), time."""
    rng = np.random.default_rng(seed)
    lines = ["user,item,cat,time"]
    for u in range(n_users):
        items = rng.choice(n_items, per_user, replace=False)
        for t, i in enumerate(items):
            lines.append(f"u{u},i{i},c{i % 4},{1000 * u + t}")
    path.write_text("\n".join(lines) + "\n")
    return path


def store_rows(path: Path) -> np.ndarray:
    """A Criteo store's rows [n, 40] (label, the 13 dense values, the 26 ids) as float64, in stored order."""
    from ctrkit.data.pipeline.feature_pipeline import DENSE_NAMES, SPARSE_NAMES
    from ctrkit.data.storage.store import Store
    s = Store(path)
    cols = [s["label"]] + [s[n] for n in DENSE_NAMES] + [s[c] for c in SPARSE_NAMES]
    return np.stack([np.asarray(c, np.float64) for c in cols], axis=1)


def two_behaviour_days(d: Path) -> tuple[Path, Path]:
    """Two small user,item,time logs under ``d``: the second brings back users A and items i1, i2, drops user B
    and items i3..i6, and brings user C and items i7, i8, i9 (for growing / expiring behaviour vocabularies)."""
    def log(name: str, users: str, items: str) -> Path:
        rows = [f"{u},{i},{t}" for t, (u, i) in enumerate(zip(users.split(), items.split()))]
        (d / name).write_text("user,item,time\n" + "\n".join(rows) + "\n")
        return d / name

    return (log("a.csv", "A A A A A B B B B", "i1 i2 i3 i4 i5 i1 i2 i6 i3"),
            log("b.csv", "A A A A C C C C C", "i7 i1 i2 i8 i1 i9 i7 i2 i8"))
