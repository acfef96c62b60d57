"""Every shipped config (configs/<dataset>/*.yaml) parses, names a registered model, and that model is
built from the config's params on the dataset's schema (from a tiny store preprocessed exactly like the
real one) and scores a batch of it. The shared blocks live in configs/_base/<dataset>.yaml."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from ctrkit.data.sources.behaviour import preprocess_behaviour
from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.data.sources.table import preprocess_table
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store
from ctrkit.jobs.tune_space import SPACE_SUFFIX
from ctrkit.models.base import logits_of
from ctrkit.models.registry import create_model, get_model_class, list_models
from ctrkit.training.config import load_config, read_config_file

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted(p for p in (REPO / "configs").glob("*/*.yaml")  # search spaces (tune) lie beside the configs
                 if not p.parent.name.startswith("_") and not p.name.endswith(SPACE_SUFFIX))
BASES = sorted((REPO / "configs" / "_base").glob("*.yaml"))
DATASETS = ("criteo", "movielens")
BEHAVIOUR_DATASETS = ("beauty", "taobao")  # behaviour stores: configs of the behaviour models
RETRIEVAL_DATASETS = ("beauty_retrieval", "ml100k_retrieval")  # positive-only behaviour stores: retrieval models
SEQUENCE_DATASETS = ("beauty_retrieval_seq", "ml100k_retrieval_seq")  # sequence rows (per-position training): sasrec
ZOO = {p.stem for p in (REPO / "src" / "ctrkit" / "models").glob("*.py") if not p.stem.startswith("_")} - {
    "__init__", "registry", "base", "scoring"}  # base.py: the model contract; scoring.py: the scoring helper
# the user-behaviour models read histories that only behaviour stores (beauty, taobao) have; dsin needs sessions
BEHAVIOUR = {"dnn", "din", "dien", "bst", "dsin"}
RETRIEVAL = {"two_tower", "youtube_dnn", "sasrec"}  # trained on positive-only behaviour stores


def _tiny_criteo(path: Path, n: int = 300, seed: int = 0) -> Path:
    """``n`` Criteo TSV rows: label, 13 integer columns (some empty), 26 hex categoricals (some empty)."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        ints = ["" if rng.random() < 0.1 else str(int(rng.integers(0, 50))) for _ in range(13)]
        cats = ["" if rng.random() < 0.05 else f"{int(rng.integers(0, 6 + j)):08x}" for j in range(26)]
        lines.append("\t".join([str(i % 2), *ints, *cats]))
    path.write_text("\n".join(lines) + "\n")
    return path


def _tiny_movielens(path: Path, n: int = 300, seed: int = 0) -> Path:
    """A CSV with the columns of examples/make_movielens_csv.py."""
    rng = np.random.default_rng(seed)
    genres = ["Action", "Comedy", "Drama", "Horror", "Sci-Fi"]
    header = "label,rating,timestamp,user_id,item_id,age,age_bucket,gender,occupation,zip_prefix,genres,year,hist_items"
    rows = [header]
    for i in range(n):
        g = "|".join(rng.choice(genres, int(rng.integers(1, 3)), replace=False))
        hist = "|".join(str(int(x)) for x in rng.integers(1, 40, int(rng.integers(0, 5))))
        rating = int(rng.integers(1, 6))
        rows.append(f"{int(rating >= 4)},{rating},{880000000 + i},{int(rng.integers(1, 30))},"
                    f"{int(rng.integers(1, 40))},{int(rng.integers(15, 70))},{int(rng.integers(0, 7))},"
                    f"{rng.choice(['M', 'F'])},{rng.choice(['student', 'writer', 'other'])},"
                    f"{int(rng.integers(100, 110))},{g},{int(rng.integers(1980, 1999))},{hist}")
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{dataset: tiny train store}, preprocessed with the options benchmarks/bench_models.py uses."""
    tmp = tmp_path_factory.mktemp("configs")
    criteo = preprocess_criteo(_tiny_criteo(tmp / "criteo.tsv"), tmp / "criteo", split="0.8,0.1,0.1", seed=0,
                               min_freq=2, embedding_dim=16, progress=False)
    ml = preprocess_table(_tiny_movielens(tmp / "ml.csv"), REPO / "examples" / "movielens_100k.yaml",
                          tmp / "movielens", split="0.8,0.1,0.1", seed=0, embedding_dim=16)
    beauty = preprocess_behaviour(_tiny_sequences(tmp / "beauty.txt"), tmp / "beauty", format="s3rec",
                                  aux_negatives=True, embedding_dim=16)
    taobao = preprocess_behaviour(_tiny_taobao(tmp / "taobao.csv"), tmp / "taobao", header=False,
                                  names="user,item,category,type,time", attr_cols=["category:cate"], time_col="time",
                                  aux_negatives=True, sessions=5, session_len=10, embedding_dim=16)
    beauty_r = preprocess_behaviour(_tiny_sequences(tmp / "beauty.txt"), tmp / "beauty_r", format="s3rec",
                                    negatives="none", embedding_dim=16)
    ml_r = preprocess_behaviour(_tiny_taobao(tmp / "taobao.csv"), tmp / "ml_r", header=False,
                                names="user,item,category,type,time", attr_cols=["category:cate"], time_col="time",
                                negatives="none", example_age=True, embedding_dim=16)
    beauty_s = preprocess_behaviour(_tiny_sequences(tmp / "beauty.txt"), tmp / "beauty_s", format="s3rec",
                                    negatives="none", train_rows="sequence", embedding_dim=16)
    ml_s = preprocess_behaviour(_tiny_taobao(tmp / "taobao.csv"), tmp / "ml_s", header=False,
                                names="user,item,category,type,time", attr_cols=["category:cate"], time_col="time",
                                negatives="none", train_rows="sequence", embedding_dim=16)
    return {"beauty_retrieval_seq": beauty_s["train"], "ml100k_retrieval_seq": ml_s["train"], "criteo": criteo["train"], "criteo1tb": criteo["train"], "criteo1tb_small": criteo["train"],
            "movielens": ml["train"], "beauty": beauty["train"], "taobao": taobao["train"],
            "beauty_retrieval": beauty_r["train"], "ml100k_retrieval": ml_r["train"]}


def _tiny_sequences(path: Path, users: int = 40, seed: int = 0) -> Path:
    """S3-Rec sequence lines ``user item item ...`` (4 to 12 items each)."""
    rng = np.random.default_rng(seed)
    lines = [" ".join(map(str, [u, *rng.integers(1, 60, int(rng.integers(4, 13)))])) for u in range(1, users + 1)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _tiny_taobao(path: Path, users: int = 30, seed: int = 0) -> Path:
    """UserBehavior rows ``user,item,category,type,time`` (no header), minutes to hours apart."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(1, users + 1):
        t = 1511544000 + np.cumsum(rng.choice([60, 600, 7200], int(rng.integers(5, 25))))
        for ts in t:
            item = int(rng.integers(1, 80))
            rows.append(f"{u},{item},{item % 7},pv,{ts}")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_every_dataset_has_a_config_per_model() -> None:
    names = set(list_models())
    assert ZOO <= names  # every model file registered itself
    for ds in DATASETS:
        have = {p.stem for p in CONFIGS if p.parent.name == ds}
        want = names - BEHAVIOUR - RETRIEVAL
        assert have == want, f"configs/{ds}: missing {sorted(want - have)}, extra {sorted(have - want)}"
    for ds in BEHAVIOUR_DATASETS:  # dsin needs timestamps (sessions): taobao only
        have = {p.stem for p in CONFIGS if p.parent.name == ds}
        want = BEHAVIOUR - ({"dsin"} if ds == "beauty" else set())
        assert have == want, f"configs/{ds}: missing {sorted(want - have)}, extra {sorted(have - want)}"
    for ds in RETRIEVAL_DATASETS:
        have = {p.stem for p in CONFIGS if p.parent.name == ds}
        assert have == RETRIEVAL, f"configs/{ds}: missing {sorted(RETRIEVAL - have)}, extra {sorted(have - RETRIEVAL)}"
    for ds in SEQUENCE_DATASETS:  # only a model with encode_positions trains on sequence rows
        assert {p.stem for p in CONFIGS if p.parent.name == ds} == {"sasrec"}, ds


@pytest.mark.parametrize("path", CONFIGS, ids=[f"{p.parent.name}/{p.stem}" for p in CONFIGS])
def test_config_builds_its_model_and_scores_a_batch(path: Path, stores: dict[str, Path]) -> None:
    cfg = load_config(path)
    assert cfg.model.name == path.stem, f"{path} trains {cfg.model.name!r}; name the file after its model"
    get_model_class(cfg.model.name)
    store = Store(stores[path.parent.name])
    torch.manual_seed(0)
    model = create_model(cfg.model.name, store.schema, **cfg.model.params)
    loader = BatchLoader(store, 64, shuffle=False, prefetch=0)
    if model.needs_prefit:  # GBDT+LR grows its trees first
        model.prefit(list(loader))
    batch = next(iter(loader))
    model.eval()
    with torch.no_grad():
        logits = logits_of(model(batch))
    assert logits.shape == (len(batch.labels),)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("dataset", DATASETS + BEHAVIOUR_DATASETS + RETRIEVAL_DATASETS + SEQUENCE_DATASETS)
def test_zoo_configs_of_a_dataset_share_data_and_base(dataset: str) -> None:
    """Side-by-side numbers need the same batches and budget: the data block, epochs, dense optimizer
    and early stopping are equal across a dataset's zoo configs (the lead's criteo/dlrm.yaml excepted, and lr,
    which is trained to its convex optimum -- tests/models/test_lr_optimum.py -- on the same stores)."""
    cfgs = {p.stem: load_config(p) for p in CONFIGS if p.parent.name == dataset}
    if dataset == "criteo":
        cfgs.pop("dlrm", None)
    if (lr := cfgs.pop("lr", None)) is not None:
        c = next(iter(cfgs.values()))
        assert (lr.data.train, lr.data.valid, lr.data.test) == (c.data.train, c.data.valid, c.data.test)
    base = {(repr(c.data), c.train.epochs, c.train.lr, c.train.dense_optimizer, c.train.sparse_optimizer,
             repr(c.train.early_stopping)) for c in cfgs.values()}
    assert len(base) == 1, base


@pytest.mark.parametrize("dataset", DATASETS + BEHAVIOUR_DATASETS + RETRIEVAL_DATASETS + SEQUENCE_DATASETS)
def test_zoo_configs_inherit_their_dataset_base_and_keep_only_what_differs(dataset: str) -> None:
    """Each model file lists configs/_base/<dataset>.yaml and repeats none of its values."""
    base_file = REPO / "configs" / "_base" / f"{dataset}.yaml"
    assert base_file in BASES
    base = read_config_file(base_file)
    assert "model" not in base and set(base) == {"data", "train", "run"}
    for path in (p for p in CONFIGS if p.parent.name == dataset):
        raw = yaml.safe_load(path.read_text())
        assert raw["defaults"] == [f"../_base/{dataset}.yaml"], path
        assert "run" not in raw, f"{path} repeats a block of its base"
        if path.stem == "lr":  # its own batch size (criteo: full batch) for the convex optimum
            assert set(raw.get("data", {})) <= {"batch_size"}, path
            continue
        assert "data" not in raw, f"{path} repeats a block of its base"
        repeated = {k for k, v in raw.get("train", {}).items() if base["train"].get(k) == v}
        assert not repeated, f"{path} repeats train keys of its base: {sorted(repeated)}"
        assert load_config(path).data == load_config(base_file).data
