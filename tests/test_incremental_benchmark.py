"""benchmarks/incremental.py's protocol: the rolling row ranges never train on what they score, and the Taobao log
(benchmarks/_rolling_data.py) against a naive reading of the raw file (labels, periods, histories that look back
only)."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import benchmark_module

INC = benchmark_module("incremental")
DATA = benchmark_module("_rolling_data")
POST = benchmark_module("incremental_posthoc")
ARGS = benchmark_module("_rolling_args")


@pytest.mark.parametrize("sizes", [[10, 7, 13, 5], [4, 4], [100, 1, 2, 50, 9, 30]])
@pytest.mark.parametrize("valid_fraction", [0.1, 0.25])
def test_ranges_never_train_on_what_they_score(sizes: list[int], valid_fraction: float) -> None:
    bounds = np.r_[0, np.cumsum(sizes)]
    rs = INC.ranges(bounds, valid_fraction)
    assert len(rs) == len(sizes) - 1  # the last period is only ever scored
    trained: list[int] = []
    for t, r in enumerate(rs):
        period = set(range(bounds[t], bounds[t + 1]))
        valid, nxt = set(range(*r["valid"])), set(range(*r["next"]))
        everything, new = set(range(*r["all"])), set(range(*r["new"]))
        assert nxt == set(range(bounds[t + 1], bounds[t + 2]))  # the next period, whole
        assert valid <= period and len(valid) == sizes[t] - int(np.floor((1 - valid_fraction) * sizes[t]))
        assert max(valid, default=-1) == bounds[t + 1] - 1 or not valid  # its last rows in time
        assert everything == set(range(min(valid, default=bounds[t + 1])))  # retrain: all before t's valid split
        assert new <= everything and not new & set(trained)  # incremental: rows not trained on before
        trained += sorted(new)
        assert not (everything | new) & (valid | nxt)  # no arm trains on its valid or evaluated rows
    assert trained == list(range(rs[-1]["all"][1]))  # incremental trains on every row once, in order


def test_taobao_log_against_the_raw_file(shared_data: Callable[[str], Path], tmp_path: Path) -> None:
    folder = shared_data("taobao_userbehavior")
    log = DATA.taobao(folder, tmp_path)
    with gzip.open(folder / "UserBehavior_head.csv.gz", "rt") as f:
        raw = [ln.rstrip("\n").split(",") for ln in f if ln.strip()]
    start, end = DATA.TAOBAO_START, DATA.TAOBAO_START + DATA.TAOBAO_DAYS * DATA.DAY
    kept = [r for r in raw if start <= int(r[4]) < end]
    assert 0 < log.rows.num_rows == len(kept) < len(raw)  # a few rows fall outside the official window
    t = log.rows["time"].to_numpy()
    assert np.all(np.diff(t) >= 0) and np.array_equal(log.period, (t - start) // DATA.DAY)
    assert np.array_equal(log.bounds()[[0, -1]], [0, len(kept)]) and len(log.bounds()) == DATA.TAOBAO_DAYS + 1
    assert int(log.rows["label"].to_numpy().sum()) == sum(r[3] != "pv" for r in kept)
    hours = (t + 8 * 3600) % DATA.DAY // 3600
    assert np.array_equal(log.rows["hour"].to_numpy(), hours)
    # histories: the user's previous (up to 20) items and categories in time order, file order among equal times
    rows = log.rows.to_pylist()
    for user in sorted({r[0] for r in kept})[:25]:
        mine = sorted((r for r in kept if r[0] == user), key=lambda r: int(r[4]))  # stable: file order on ties
        got = [r for r in rows if r["user_id"] == int(user)]
        got.sort(key=lambda r: r["time"])
        assert [str(r["item_id"]) for r in got] == [r[1] for r in mine]
        for i, r in enumerate(got):
            assert r["hist_items"] == "|".join(m[1] for m in mine[max(0, i - 20):i])
            assert r["hist_cates"] == "|".join(m[2] for m in mine[max(0, i - 20):i])


@pytest.mark.parametrize("sizes", [[10, 7, 13, 5], [40, 3, 60, 20, 9]])
@pytest.mark.parametrize("fraction", [0.5, 1.0, 3.0])
def test_replay_draws_only_earlier_train_rows(sizes: list[int], fraction: float) -> None:
    bounds = np.r_[0, np.cumsum(sizes)]
    rs = INC.ranges(bounds, 0.25)
    for t, r in enumerate(rs):
        idx = INC.replay_rows(r["earlier"], r["new"][1] - r["new"][0], fraction, 0, t)
        # naive reference: every period k < t's rows minus its validation split (rs[k]["valid"])
        pool = {i for k in range(t) for i in range(bounds[k], bounds[k + 1]) if not rs[k]["valid"][0] <= i < rs[k]["valid"][1]}
        assert set(idx.tolist()) <= pool and len(set(idx.tolist())) == len(idx)  # earlier train rows, no repeats
        assert len(idx) == min(len(pool), round(fraction * (r["new"][1] - r["new"][0])))
        banned = set(range(*r["new"])) | set(range(*r["valid"])) | set(range(*r["next"]))
        assert not banned & set(idx.tolist())  # never the new, validation or evaluated rows
        assert np.array_equal(idx, INC.replay_rows(r["earlier"], r["new"][1] - r["new"][0], fraction, 0, t))
    assert len(INC.replay_rows(rs[0]["earlier"], 5, 1.0, 0, 0)) == 0  # period 0 has nothing to replay
    last = rs[-1]
    a, b = (INC.replay_rows(last["earlier"], 4, 1.0, s, len(rs) - 1) for s in (0, 1))
    assert not np.array_equal(a, b)  # the seed picks the sample


def test_id_dropout_option_reads_key_probability_pairs() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    assert ARGS.id_dropout(["user_id=0.1", "item_id=0.25"], ap) == {"user_id": 0.1, "item_id": 0.25}
    assert ARGS.id_dropout([], ap) == {}
    with pytest.raises(SystemExit):  # argparse's error: exit 2 with the option named
        ARGS.id_dropout(["user_id"], ap)


def test_average_over_periods_against_a_loop() -> None:
    import torch

    g = torch.Generator().manual_seed(0)
    prev = {"t": torch.randn(3, 2, generator=g), "b": torch.tensor(0.5), "n": torch.tensor([1, 2])}
    new = {"t": torch.randn(5, 2, generator=g), "b": torch.tensor(1.5), "n": torch.tensor([3, 4]),
           "x": torch.randn(2, generator=g)}
    kept = [{k: v.clone() for k, v in d.items()} for d in (prev, new)]
    out = POST.average(prev, new, 0.25)
    for i in range(5):  # rows of the grown table: old rows mixed, new rows (ids new at t) as in ``new``
        for j in range(2):
            want = 0.25 * prev["t"][i, j] + 0.75 * new["t"][i, j] if i < 3 else new["t"][i, j]
            assert abs(float(out["t"][i, j] - want)) < 1e-6
    assert abs(float(out["b"]) - (0.25 * 0.5 + 0.75 * 1.5)) < 1e-6
    assert torch.equal(out["n"], new["n"]) and torch.equal(out["x"], new["x"])  # integers and new entries: new's
    assert all(torch.equal(d[k], c[k]) for d, c in zip((prev, new), kept) for k in d)  # the inputs left as they were


def test_movielens_validation_rows_come_after_the_training_rows_in_time(shared_data: Callable[[str], Path],
                                                                       tmp_path: Path) -> None:
    """Every arm's validation split is the end of its period in time, not a random draw: no training row of any arm
    is later than a validation row, and the scored period comes after both."""
    log = DATA.movielens(shared_data("movielens_100k"), tmp_path)
    ts = log.rows["timestamp"].to_numpy()
    assert np.all(np.diff(ts) >= 0) and np.all(np.diff(log.period) >= 0)
    for r in INC.ranges(log.bounds(), 0.1):
        valid, nxt = ts[slice(*r["valid"])], ts[slice(*r["next"])]
        assert ts[slice(*r["all"])].max() <= valid.min() and valid.max() <= nxt.min()


@pytest.mark.parametrize("argv, message", [(["--warm-average", "keep"], "needs --ema-decay"),
                                           (["--ema-decay", "1.5"], "strictly between 0 and 1")])
def test_weight_average_options_are_checked(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        INC.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_warm_learning_rates_are_set_per_data_set() -> None:
    assert INC.WARM_LR.keys() == DATA.LOADERS.keys()
    assert all(lr is None or lr > 0 for pair in INC.WARM_LR.values() for lr in pair)
    assert INC.REFRESH_EVERY.keys() == DATA.LOADERS.keys() and all(k >= 0 for k in INC.REFRESH_EVERY.values())


@pytest.mark.parametrize("every", [0, 1, 2, 3])
def test_refresh_periods_are_the_multiples_of_k(every: int) -> None:
    got = [t for t in range(10) if INC.refreshes(t, every)]
    assert got == ([t for t in range(1, 10) if t % every == 0] if every else [])  # never period 0 (a fit anyway)


def test_refresh_every_must_not_be_negative(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        INC.main(["--refresh-every", "-1"])
    assert e.value.code == 2 and "--refresh-every must be >= 0" in capsys.readouterr().err


def test_shrink_perturb_needs_a_warm_refresh(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        INC.main(["--refresh-every", "2", "--shrink-perturb", "0.5", "0.1"])
    assert e.value.code == 2 and "--shrink-perturb applies to the refreshes of --refresh-from warm" in capsys.readouterr().err


def fake_fit(runs: Path, name: str) -> dict[str, Any]:
    """What a faked ``train`` returns: every fit 10 s, its checkpoint at runs/name/best.pt."""
    return {"auc": 0.5, "gauc": 0.5, "rows": 1, "train_s": 10.0, "job_s": 11.0, "valid_auc": 0.6, "best_epoch": 1,
            "epochs": 1, "best": str(runs / name / "best.pt")}


def toy_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, periods: int, **fakes: Any) -> Any:
    """A log of one row per period with every step of :func:`INC.roll` faked (``fakes`` by name: train,
    incremental, preprocess; the rest scores nothing and writes nothing) -> the log."""
    import pyarrow as pa

    for name, fn in {"preprocess": lambda *a, **k: 0.5, **fakes}.items():
        monkeypatch.setattr(INC, name, fn)
    monkeypatch.setattr(INC, "frozen", lambda ckpt, store: {"auc": 0.5, "gauc": 0.5, "rows": 1})
    monkeypatch.setattr(INC, "unseen", lambda store: {"user_id": 0.0, "item_id": 0.0})
    monkeypatch.setattr(INC, "vocab_growth", lambda stores: {"store": stores.name})
    monkeypatch.setattr(INC, "write", lambda log, lo, hi, path: path)
    rows = periods  # one row per period, whatever roll asks for
    monkeypatch.setattr(DATA.Log, "bounds", lambda self, periods=None: np.arange(rows + 1))
    return DATA.Log("toy", pa.table({"x": list(range(rows))}), np.arange(rows), tmp_path / "spec.yaml", "day")


@pytest.mark.parametrize("only", [False, True])
def test_a_refresh_period_is_the_retrain_run_and_the_next_warm_start_continues_from_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, only: bool) -> None:
    """With --refresh-every 2 the incremental arm's model of periods 2 and 4 is the retrain arm's fit (its seconds
    counted, also with --tune, where the retrain arm does not run otherwise), and the warm starts of periods 3 and 5
    grow their vocabulary from that fit's store and start from its checkpoint; other periods warm-start from the
    incremental arm's own previous run."""
    calls: list[tuple[str, int, Any]] = []

    def fake_train(store: Path, runs: Path, name: str, overrides: list[str], warm: Path | None = None) -> dict:
        calls.append(("train", int(name[2:]), store.name))
        return fake_fit(runs, name)

    def fake_incremental(log, r, d: Path, t: int, prev, overrides, warm, valid, test) -> dict:
        calls.append(("incremental", t, prev and (str(prev[0].relative_to(tmp_path)), Path(prev[1]).parent.name)))
        return {**fake_train(d / "inc", d.parent / "runs", f"in{t}", []), "prep_s": 0.0, "replayed_rows": 0}

    log = toy_log(monkeypatch, tmp_path, 7, train=fake_train, incremental=fake_incremental)
    recs = INC.roll(log, 7, tmp_path, [], 0.0, INC.Warm(only=only, refresh_every=2))
    assert [r["t"] for r in recs] == list(range(6))
    warm_starts = [c for c in calls if c[0] == "incremental"]
    assert warm_starts == [("incremental", 0, None), ("incremental", 1, ("p0/inc/train", "in0")),
                           ("incremental", 3, ("p2/re/train", "re2")), ("incremental", 5, ("p4/re/train", "re4"))]
    # (p{t}/re/train: the refresh's store, the parent of the next grown vocabulary; runs/re{t}: its fit)
    refits = [c[1] for c in calls if c[0] == "train" and c[2] == "re"]
    assert refits == ([2, 4] if only else [1, 2, 3, 4, 5])  # --tune: the retrain arm runs only to refresh
    for r in recs[1:]:
        inc = r["incremental"]
        assert inc.get("refresh", False) == (r["t"] in (2, 4)) and r["vocab"]["store"] == ("re" if inc.get("refresh") else "inc")
        if inc.get("refresh"):
            assert inc["best"].endswith(f"re{r['t']}/best.pt") and inc["train_s"] == 10.0
    if not only:
        s = INC.summarise(recs)
        assert s["incremental"]["refresh_periods"] == [2, 4]
        assert s["incremental"]["train_s_total"] == s["retrain"]["train_s_total"] == 50.0  # fake: every fit 10 s


def test_posthoc_gap_reads_a_refresh_period_as_the_retrain_run(tmp_path: Path, capsys) -> None:
    """``incremental_posthoc.py gap OUT OUT``: a period without an inc{t} run (a refresh) counts as a difference of 0;
    the others are inc{t} - re{t}, validation (summary.json) and next-period AUC (predictions.npz, sklearn's AUC),
    pooled over the runs given; warm periods are also grouped by periods since the last refresh."""
    import json

    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    label = rng.integers(0, 2, 200)
    diffs: dict[tuple[int, int], tuple[float, float]] = {}
    for seed in (0, 1):
        for t in (1, 2, 3):
            runs = {"re": 0.70 + 0.01 * t} | ({} if t == 2 else {"inc": 0.69 + 0.02 * t + 0.001 * seed})  # 2: refresh
            auc = {}
            for arm, valid in runs.items():
                run = tmp_path / f"s{seed}" / "movielens" / "runs" / f"{arm}{t}"
                run.mkdir(parents=True)
                score = label * 0.3 * rng.random() + rng.random(200)
                np.savez(run / "predictions.npz", label=label, score=score, group=np.zeros(200))
                (run / "summary.json").write_text(json.dumps({"best": {"value": valid, "epoch": 0}}))
                auc[arm] = (valid, roc_auc_score(label, score))
            inc = auc.get("inc", auc["re"])
            diffs[seed, t] = (inc[0] - auc["re"][0], inc[1] - auc["re"][1])
    POST.main(["gap", str(tmp_path / "s0"), str(tmp_path / "s1")])
    out = capsys.readouterr().out.splitlines()
    assert [ln.split(" (")[0] for ln in out] == ["incremental - retrain, all periods", "incremental - retrain, warm periods",
                                                 "incremental - retrain, 1 after a refresh"]

    def stats(keys: list[tuple[int, int]], i: int) -> str:
        x = [diffs[k][i] for k in keys]
        return f"{np.mean(x):+.4f} ± {np.std(x, ddof=1) / len(x) ** 0.5:.4f}"

    every = sorted(diffs)
    assert f"all periods (6), valid AUC {stats(every, 0)}, next-period AUC {stats(every, 1)}" in out[0]
    warm = [k for k in every if k[1] != 2]
    assert f"warm periods (4), valid AUC {stats(warm, 0)}, next-period AUC {stats(warm, 1)}" in out[1]
    assert f"1 after a refresh (2), valid AUC {stats([(0, 3), (1, 3)], 0)}" in out[2]  # period 1 has no refresh before
    with pytest.raises(SystemExit):  # the other readings take one directory
        POST.main(["split", str(tmp_path / "s0"), str(tmp_path / "s1")])


@pytest.mark.parametrize("only", [False, True])
def test_a_warm_refresh_continues_from_the_arms_model_on_every_row_so_far(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, only: bool) -> None:
    """--refresh-from warm: a refresh period's model is a warm start from the incremental arm's previous model (not the
    retrain arm's fit), on a store of every row so far grown from that model's vocabulary (p{t}/inca), with the
    refresh's shrink / perturb overrides; the next warm run continues from it. With --tune no retrain fit runs."""
    calls: list[tuple[str, int, Any, Any]] = []

    def fake_train(store: Path, runs: Path, name: str, overrides: list[str], warm: Path | None = None) -> dict:
        calls.append((name, store.name, warm and warm.parent.name, [o for o in overrides if "shrink" in o]))
        return fake_fit(runs, name)

    grown: list[tuple[str, str | None]] = []

    def fake_incremental(log, r, d: Path, t: int, prev, overrides, warm, valid, test) -> dict:
        grown.append((str((d / "inc").relative_to(tmp_path)), prev and str(prev[0].relative_to(tmp_path))))
        out = fake_train(d / "inc", d.parent / "runs", f"inc{t}", overrides, prev and Path(prev[1]))
        return {**out, "prep_s": 0.0, "replayed_rows": 0}

    def fake_preprocess(spec, csv, out, *, valid=None, test=None, parent=None, grow=False) -> float:
        grown.append((str(out.relative_to(tmp_path)), parent and str(parent.relative_to(tmp_path))))
        return 0.5

    log = toy_log(monkeypatch, tmp_path, 6, train=fake_train, incremental=fake_incremental, preprocess=fake_preprocess)
    sp = ("--train.warm_start_shrink=0.5", "--train.warm_start_perturb=0.1")
    recs = INC.roll(log, 6, tmp_path, [], 0.0, INC.Warm(only=only, refresh_every=2, refresh_from="warm", shrink_perturb=sp))
    inc = [c for c in calls if c[0].startswith("inc")]
    assert inc == [("inc0", "inc", None, []), ("inc1", "inc", "inc0", []), ("inc2", "inca", "inc1", [sp[0]]),
                   ("inc3", "inc", "inc2", []), ("inc4", "inca", "inc3", [sp[0]])]
    assert ("p2/inca", "p1/inc/train") in grown and ("p4/inca", "p3/inc/train") in grown  # grown from the arm's store
    assert ("p3/inc", "p2/inca/train") in grown  # the next warm run grows from the refresh's store
    assert [c[0] for c in calls if c[0].startswith("re")] == ([] if only else ["re1", "re2", "re3", "re4"])
    assert [r["t"] for r in recs if r["incremental"].get("refresh")] == [2, 4]


def test_first_warm_epochs_cap_only_the_run_right_after_a_fit_on_every_row() -> None:
    """--first-warm-epochs: periods 1, K + 1, 2K + 1 ... (after period 0's fit or a refresh) get it, the other warm
    runs --warm-epochs (None: --epochs)."""
    warm = INC.Warm(refresh_every=4, first_epochs=1)
    assert [INC.epochs_of(t, warm) for t in range(1, 11)] == [1, None, None, None, 1, None, None, None, 1, None]
    both = INC.Warm(refresh_every=0, first_epochs=2, epochs=3)
    assert [INC.epochs_of(t, both) for t in range(1, 5)] == [2, 3, 3, 3]
    with pytest.raises(SystemExit):
        ARGS.parse(["--first-warm-epochs", "0"], "x", INC.QUICK)


def test_rolling_origin_choice_never_reads_its_own_block() -> None:
    """posthoc ``choose``: block 0 takes the default; each later block the candidate best on the earlier blocks' warm
    periods (a tie: the earlier candidate), and changing a block's own or later records never changes its choice."""
    blocks = [[1, 2, 3], [5, 6, 7], [9, 10, 11], [13]]
    rec = [{t: 0.70 for b in blocks for t in b}, {t: 0.70 for b in blocks for t in b}, {t: 0.70 for b in blocks for t in b}]
    assert POST.choose(rec, blocks) == [0, 0, 0, 0]  # ties keep the default
    rec[2].update({1: 0.80})  # candidate 2 wins block 0 by far ...
    rec[1].update({5: 0.90, 6: 0.90})  # ... candidate 1 block 1
    assert POST.choose(rec, blocks) == [0, 2, 1, 1]  # means over 1-3: c2; over 1-7: c1 (.7000 / .7667 / .7167)
    rng = np.random.default_rng(1)
    for _ in range(20):
        rec = [{t: float(rng.random()) for b in blocks for t in b} for _ in range(3)]
        got = POST.choose(rec, blocks)
        for k, block in enumerate(blocks):
            later = [{t: (v if any(t in b for b in blocks[:k]) else float(rng.random())) for t, v in r.items()} for r in rec]
            assert POST.choose(later, blocks)[: k + 1] == got[: k + 1]
            seen = [t for b in blocks[:k] for t in b]
            if seen:  # a naive reading: the argmax of the means over the earlier blocks
                assert got[k] == int(np.argmax([np.mean([r[t] for t in seen]) for r in rec]))


def test_posthoc_gap_against_full_runs_reads_tune_runs(tmp_path: Path, capsys) -> None:
    """``gap TUNE --retrain FULL``: a ``--tune`` run (inc1, refresh re2, inc3) against a full run's retrain arm
    (re1, re2, re3); the refresh period counts 0 when its fit scores as the full run's, and stops the reading when not."""
    import json

    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(1)
    label = rng.integers(0, 2, 200)
    scores = {name: label * 0.3 * rng.random() + rng.random(200) for name in ("inc1", "inc3", "re1", "re2", "re3")}

    def run(out: str, name: str, valid: float, score: np.ndarray) -> None:
        d = tmp_path / out / "movielens" / "runs" / name
        d.mkdir(parents=True)
        np.savez(d / "predictions.npz", label=label, score=score, group=np.zeros(200))
        (d / "summary.json").write_text(json.dumps({"best": {"value": valid, "epoch": 0}}))

    for t in (1, 2, 3):
        run("full", f"re{t}", 0.70 + 0.01 * t, scores[f"re{t}"])
    run("tune", "inc1", 0.705, scores["inc1"])
    run("tune", "re2", 0.70 + 0.01 * 2, scores["re2"])
    run("tune", "inc3", 0.725, scores["inc3"])
    POST.main(["gap", str(tmp_path / "tune"), "--retrain", str(tmp_path / "full")])
    out = capsys.readouterr().out.splitlines()
    auc = {k: roc_auc_score(label, v) for k, v in scores.items()}
    valid = [0.705 - 0.71, 0.0, 0.725 - 0.73]
    nxt = [auc["inc1"] - auc["re1"], 0.0, auc["inc3"] - auc["re3"]]
    se = np.std(valid, ddof=1) / 3 ** 0.5
    assert out[0].startswith(f"incremental - retrain, all periods (3), valid AUC {np.mean(valid):+.4f} ± {se:.4f}, "
                             f"next-period AUC {np.mean(nxt):+.4f}")
    run("other", "inc1", 0.705, scores["inc1"])
    run("other", "re2", 0.72, scores["re1"])  # not the full run's fit of period 2
    run("other", "inc3", 0.725, scores["inc3"])
    with pytest.raises(SystemExit, match="refresh period 2"):
        POST.main(["gap", str(tmp_path / "other"), "--retrain", str(tmp_path / "full")])
    with pytest.raises(SystemExit):  # one full run per OUT
        POST.main(["gap", str(tmp_path / "tune"), str(tmp_path / "other"), "--retrain", str(tmp_path / "full")])
    run("short", "inc1", 0.705, scores["inc1"])  # periods 2 and 3 missing
    with pytest.raises(SystemExit, match="period 2 has neither"):
        POST.main(["gap", str(tmp_path / "short"), "--retrain", str(tmp_path / "full")])


def test_posthoc_rolling_scores_the_chosen_candidate_per_block(tmp_path: Path, capsys) -> None:
    """``incremental_posthoc.py rolling C0 C1 --retrain FULL``: refresh period 2 (no inc2 run) is the retrain fit in
    every candidate; blocks [1] and [3]; block [3] takes the candidate with the better next-period AUC at period 1;
    the arm's AUC is the chosen runs' (sklearn) against the retrain arm's, its seconds every candidate's warm runs
    plus the refresh."""
    import json

    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    label = rng.integers(0, 2, 300)
    auc: dict[tuple[str, int], float] = {}

    def run(out: str, name: str, signal: float, seconds: float) -> None:
        d = tmp_path / out / "movielens" / "runs" / name
        d.mkdir(parents=True)
        score = label * signal + np.random.default_rng(len(name) + int(signal * 100)).random(300)
        np.savez(d / "predictions.npz", label=label, score=score, group=np.arange(300) % 7)
        (d / "summary.json").write_text(json.dumps({"best": {"value": 0.6, "epoch": 0}, "train_seconds": seconds}))
        auc[out, int(name[2:]) if name.startswith("re") else int(name[3:])] = roc_auc_score(label, score)

    for t in (1, 2, 3):
        run("full", f"re{t}", 0.5, 10.0)
    for out, signal in (("c0", 0.2), ("c1", 0.4)):
        run(out, "re2", 0.5, 10.0)
        for t in (1, 3):
            run(out, f"inc{t}", signal + 0.01 * t, 1.0)
    POST.main(["rolling", str(tmp_path / "c0"), str(tmp_path / "c1"), "--retrain", str(tmp_path / "full")])
    got = json.loads(capsys.readouterr().out)
    assert got["blocks"] == [[1, 1, 0], [3, 3, 1 if auc["c1", 1] > auc["c0", 1] else 0]]
    want = np.mean([auc["c0", 1], auc["full", 2], auc["c1" if got["blocks"][1][2] else "c0", 3]])
    assert got["rolling"]["auc"] == pytest.approx(want) and got["refresh_auc_max_difference"] == pytest.approx(0.0)
    assert got["rolling_minus_retrain_auc"] == pytest.approx(want - np.mean([auc["full", t] for t in (1, 2, 3)]))
    assert got["train_s"] == {"rolling_all_candidates": 14.0, "rolling_chosen_only": 12.0, "retrain": 30.0}
    for c, row in zip(("c0", "c1"), got["candidates_minus_retrain_by_position"]):  # both blocks hold one warm period
        assert row == pytest.approx([np.mean([auc[c, t] - auc["full", t] for t in (1, 3)])])
    with pytest.raises(SystemExit):  # rolling needs the full run's retrain arm
        POST.main(["rolling", str(tmp_path / "c0"), str(tmp_path / "c1")])


def test_first_warm_run_after_a_fit_gets_its_own_rates_and_epochs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--first-warm-lr-scale / --first-warm-epochs reach ``ctrkit train`` for the warm runs of periods 1 and 5 only
    (after period 0 and the refresh of period 4); the other warm runs keep the warm rates and --epochs."""
    seen: dict[str, list[str]] = {}

    def fake_train(store: Path, runs: Path, name: str, overrides: list[str], warm: Path | None = None) -> dict:
        seen[name] = [o for o in overrides if o.startswith(("--train.lr=", "--train.embedding_lr=", "--train.epochs="))]
        return fake_fit(runs, name)

    log = toy_log(monkeypatch, tmp_path, 8, train=fake_train)
    INC.roll(log, 8, tmp_path, [], 0.0, INC.Warm(only=True, refresh_every=4, dense_lr=5e-4, embedding_lr=6.25e-4,
                                                 first_lr_scale=4.0, first_epochs=2))
    first = ["--train.lr=0.002", "--train.embedding_lr=0.0025", "--train.epochs=2"]
    later = ["--train.lr=0.0005", "--train.embedding_lr=0.000625"]
    assert {k: v for k, v in seen.items() if k.startswith("inc")} == {
        "inc0": [], "inc1": first, "inc2": later, "inc3": later, "inc5": first, "inc6": later}
    assert seen["re4"] == []  # the refresh: the config's rates and epochs
    with pytest.raises(SystemExit):
        ARGS.parse(["--first-warm-lr-scale", "0"], "x", INC.QUICK)


def test_warm_lr_schedule_reaches_the_warm_runs_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--warm-lr-schedule KEY=VALUE ... becomes ``--train.lr_schedule.*`` overrides of every warm run (periods 1-3,
    5-6), never of period 0's fit or the refresh of period 4; a bad key or value is refused before any run."""
    seen: dict[str, list[str]] = {}

    def fake_train(store: Path, runs: Path, name: str, overrides: list[str], warm: Path | None = None) -> dict:
        seen[name] = [o for o in overrides if o.startswith("--train.lr_schedule.")]
        return fake_fit(runs, name)

    a, _ = ARGS.parse(["--warm-lr-schedule", "type=plateau", "factor=0.5", "min_lr=1e-4"], "x", INC.QUICK)
    sched = ["--train.lr_schedule.type=plateau", "--train.lr_schedule.factor=0.5", "--train.lr_schedule.min_lr=1e-4"]
    assert list(a.warm_lr_schedule) == sched
    log = toy_log(monkeypatch, tmp_path, 8, train=fake_train)
    INC.roll(log, 8, tmp_path, [], 0.0, INC.Warm(only=True, refresh_every=4, lr_schedule=a.warm_lr_schedule))
    assert seen == {"inc0": [], "inc1": sched, "inc2": sched, "inc3": sched, "re4": [], "inc5": sched, "inc6": sched}
    for bad in (["type=cosine"], ["factor=-1"], ["plateau"], ["facter=0.5"]):
        with pytest.raises(SystemExit):
            ARGS.parse(["--warm-lr-schedule", *bad], "x", INC.QUICK)


@pytest.mark.parametrize("sizes", [[10, 7, 13, 5, 8], [40, 3, 60, 20, 9, 4]])
@pytest.mark.parametrize("window", [1, 2, 3])
def test_a_warm_window_holds_the_earlier_periods_new_rows_only(sizes: list[int], window: int) -> None:
    """``--warm-window W``: rows [starts[t - W + 1], new's start) are the new rows of periods t - W + 1 .. t - 1
    (naive reference: the union of their ``new`` ranges), never period t's validation or the evaluated rows."""
    bounds = np.r_[0, np.cumsum(sizes)]
    rs = INC.ranges(bounds, 0.25)
    for t, r in enumerate(rs):
        got = set(range(r["starts"][max(0, t - window + 1)], r["new"][0]))
        want = {i for k in range(max(0, t - window + 1), t) for i in range(*rs[k]["new"])}
        assert got == want and not got & (set(range(*r["valid"])) | set(range(*r["next"])) | set(range(*r["new"])))


def test_warm_ema_decay_and_window_reach_the_warm_runs_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--warm-ema-decay D: every warm run (periods 1-3, 5-6) gets train.ema_decay D and warm_start_average start,
    never period 0's fit or the refresh of period 4. --warm-window 2: each warm run's training store is period t - 1's
    new rows then period t's (the toy log's column x is the row's index), encoded with the vocabulary of period t's
    new rows; period 1 after period 0 and period 5 after the refresh alike."""
    import pyarrow.csv as pacsv

    seen: dict[str, tuple[str, list[str]]] = {}
    stores: dict[str, Path] = {}

    def fake_train(store: Path, runs: Path, name: str, overrides: list[str], warm: Path | None = None) -> dict:
        seen[name] = (store.name, [o for o in overrides if o.startswith(("--train.ema_decay", "--train.warm_start_av"))])
        return fake_fit(runs, name)

    def fake_preprocess(spec, csv: Path, out: Path, **kw) -> float:
        stores[str(out.relative_to(tmp_path))] = kw.get("parent") and kw["parent"].relative_to(tmp_path)
        return 0.5

    log = toy_log(monkeypatch, tmp_path, 8, train=fake_train, preprocess=fake_preprocess)
    a, _ = ARGS.parse(["--warm-ema-decay", "0.95", "--warm-window", "2"], "x", INC.QUICK)
    recs = INC.roll(log, 8, tmp_path, ["--train.ema_decay=null"], 0.0,
                    INC.Warm(only=True, refresh_every=4, ema_decay=a.warm_ema_decay, window=a.warm_window))
    avg = ["--train.ema_decay=null", "--train.ema_decay=0.95", "--train.warm_start_average=start"]
    assert seen == {"inc0": ("inc", ["--train.ema_decay=null"]), **{f"inc{t}": ("incr", avg) for t in (1, 2, 3, 5, 6)},
                    "re4": ("re", ["--train.ema_decay=null"])}
    for t in (1, 2, 3, 5, 6):  # one row per period: rows t - 1 and t
        x = pacsv.read_csv(tmp_path / f"p{t}" / "new_replay.csv")["x"].to_pylist()
        assert x == [t - 1, t] and recs[t]["incremental"]["window_rows"] == 1
        assert stores[f"p{t}/incr"] == Path(f"p{t}/inc/train")  # encoded with period t's grown vocabulary
    for bad in (["--warm-ema-decay", "1"], ["--warm-window", "0"], ["--warm-ema-decay", "0.9", "--ema-decay", "0.9"]):
        with pytest.raises(SystemExit):
            ARGS.parse(bad, "x", INC.QUICK)


@pytest.mark.parametrize(("argv", "want_first", "want_later"), [
    (["--first-warm-optimizer", "fresh"], "fresh", "keep"),
    ([], "keep", "keep"),
    (["--warm-optimizer", "fresh"], "fresh", "fresh"),
    (["--warm-optimizer", "fresh", "--first-warm-optimizer", "keep"], "keep", "fresh")])
def test_first_warm_optimizer_reaches_the_first_warm_run_after_a_fit_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], want_first: str, want_later: str) -> None:
    """--first-warm-optimizer: train.warm_start_optimizer of the warm runs of periods 1 and 5 (after period 0 and the
    refresh of period 4); the other warm runs (2, 3, 6) keep --warm-optimizer's; period 0's fit and the refresh set
    none (they start from scratch). A value other than keep / fresh is refused before any run."""
    seen: dict[str, list[str]] = {}

    def fake_train(store: Path, runs: Path, name: str, overrides: list[str], warm: Path | None = None) -> dict:
        seen[name] = [o.split("=")[1] for o in overrides if o.startswith("--train.warm_start_optimizer=")]
        return fake_fit(runs, name)

    a, _ = ARGS.parse(argv, "x", INC.QUICK)
    log = toy_log(monkeypatch, tmp_path, 8, train=fake_train)
    INC.roll(log, 8, tmp_path, [], 0.0, INC.Warm(only=True, refresh_every=4, optimizer=a.warm_optimizer,
                                                 first_optimizer=a.first_warm_optimizer))
    assert seen == {"inc0": [], "inc1": [want_first], "inc2": [want_later], "inc3": [want_later], "re4": [],
                    "inc5": [want_first], "inc6": [want_later]}
    with pytest.raises(SystemExit):
        ARGS.parse(["--first-warm-optimizer", "reset"], "x", INC.QUICK)


def test_posthoc_paired_pools_seeds_by_the_base_blocks_position(tmp_path: Path, capsys) -> None:
    """``incremental_posthoc.py paired BASE CAND BASE CAND``: over the base's warm periods 1, 2, 3, 5 (4: a refresh,
    no inc4), the candidate's model (inc{t}, or re{t} where it refits instead, as ``--refresh-every 2`` at t = 2)
    minus the base's, next-period AUC (sklearn) and validation AUC, pooled over both seeds; positions 1, 2, 3, 1
    (period 5 follows the refresh); an odd number of directories is refused."""
    import json

    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(2)
    label = rng.integers(0, 2, 150)
    got_rows: list[tuple[int, float, float]] = []

    def run(out: str, name: str) -> tuple[float, float]:
        d = tmp_path / out / "movielens" / "runs" / name
        d.mkdir(parents=True)
        score, valid = label * rng.random() + rng.random(150), float(rng.random())
        np.savez(d / "predictions.npz", label=label, score=score, group=np.zeros(150))
        (d / "summary.json").write_text(json.dumps({"best": {"value": valid, "epoch": 0}, "epochs_trained": len(name)}))
        return valid, roc_auc_score(label, score)

    for seed in (0, 1):
        run(f"b{seed}", "re4")
        for t, pos in ((1, 1), (2, 2), (3, 3), (5, 1)):
            bv, bn = run(f"b{seed}", f"inc{t}")
            cv, cn = run(f"c{seed}", f"re{t}" if t == 2 else f"inc{t}")
            got_rows.append((pos, cn - bn, cv - bv))
    POST.main(["paired", *(str(tmp_path / f"{k}{s}") for s in (0, 1) for k in ("b", "c"))])
    got = json.loads(capsys.readouterr().out)

    def want(sel: list[tuple[int, float, float]], i: int) -> dict[str, float]:
        x = [r[i] for r in sel]
        return {"mean": pytest.approx(np.mean(x)), "se": pytest.approx(np.std(x, ddof=1) / len(x) ** 0.5)}

    assert got["n"] == 8 and got["next"] == want(got_rows, 1) and got["valid"] == want(got_rows, 2)
    for k, g in enumerate(got["by_position"], start=1):
        sel = [r for r in got_rows if r[0] == k]
        assert g["n"] == len(sel) and g["next"] == want(sel, 1) and g["valid"] == want(sel, 2)
    assert [g["n"] for g in got["by_position"]] == [4, 2, 2]
    assert got["epochs"] == {"candidate": pytest.approx(3.75), "base": pytest.approx(4.0)}  # len("re2") == 3
    with pytest.raises(SystemExit):
        POST.main(["paired", str(tmp_path / "b0"), str(tmp_path / "c0"), str(tmp_path / "b1")])
