"""Run reports: plot data against naive references, pages of fabricated runs (every section, every note), and
end to end: real trainings, their report.html and a comparison rendered by headless Chromium, whose screenshot
must show each PNG where the page puts it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fake_run import make_fake_run
from matplotlib.image import imread

from ctrkit.cli import main
from ctrkit.errors import JobError, StoreError
from ctrkit.metrics import roc_auc
from ctrkit.report import compare_report, write_report
from ctrkit.report.curves import (
    calibration_bins,
    group_aucs,
    roc_area,
    roc_points,
    score_histograms,
    thin_curve,
)
from ctrkit.report.plots import SIZE_PX

sklearn_metrics = pytest.importorskip("sklearn.metrics")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
RUN_PLOTS = {"loss", "metrics", "roc", "calibration", "scores", "gauc"}


def _scores(n: int, seed: int, ties: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(2 * x - 2)))).astype(np.float32)
    s = 1 / (1 + np.exp(-(x - 2)))
    return (np.round(s, 2) if ties else s).astype(np.float32), y


# ---- plot data against references -------------------------------------------------------------------
@pytest.mark.parametrize("ties", [False, True])
def test_roc_points_are_sklearns_and_their_area_is_the_auc(ties):
    s, y = _scores(2000, 1, ties)
    fpr, tpr, thr = roc_points(s, y)
    want_fpr, want_tpr, want_thr = sklearn_metrics.roc_curve(y, s, drop_intermediate=False)
    np.testing.assert_allclose(fpr, want_fpr, atol=1e-12)
    np.testing.assert_allclose(tpr, want_tpr, atol=1e-12)
    np.testing.assert_array_equal(thr[1:], want_thr[1:])
    assert np.isinf(thr[0])
    assert roc_area(fpr, tpr) == pytest.approx(roc_auc(s, y), abs=1e-12)
    assert roc_area(fpr, tpr) == pytest.approx(sklearn_metrics.auc(want_fpr, want_tpr), abs=1e-12)


def test_roc_of_one_class_is_an_error():
    with pytest.raises(ValueError, match="both classes: 0 positive and 3 negative"):
        roc_points(np.array([0.1, 0.2, 0.3]), np.zeros(3))


def test_thin_curve_keeps_the_ends_and_the_area():
    s, y = _scores(200_000, 2, False)
    fpr, tpr, _ = roc_points(s, y)
    x2, y2 = thin_curve(fpr, tpr, max_points=1000)
    assert x2.size <= 1002 and (x2[0], y2[0], x2[-1], y2[-1]) == (0, 0, 1, 1)
    assert np.all(np.diff(x2) >= 0) and np.all(np.diff(y2) >= 0)
    assert roc_area(x2, y2) == pytest.approx(roc_area(fpr, tpr), abs=2e-3)
    short = thin_curve(fpr[:10], tpr[:10], max_points=1000)  # fewer points than asked: as they are
    assert np.array_equal(short[0], fpr[:10]) and np.array_equal(short[1], tpr[:10])


@pytest.mark.parametrize("ties", [False, True])
def test_calibration_bins_match_a_loop(ties):
    s, y = _scores(5000, 3, ties)
    got = calibration_bins(s, y, bins=10)
    edges = np.unique(np.quantile(s.astype(np.float64), np.linspace(0, 1, 11)))
    want = []
    for k in range(len(edges) - 1):  # [lo, hi), the last bin closed
        inside = [i for i in range(len(s)) if edges[k] <= s[i] and (s[i] < edges[k + 1] or k == len(edges) - 2)]
        if inside:
            r = float(np.mean(y[inside].astype(np.float64)))
            want.append((edges[k], edges[k + 1], len(inside), float(np.mean(s[inside].astype(np.float64))), r,
                         (r * (1 - r) / len(inside)) ** 0.5))
    w = np.array(want)
    for j, got_col in enumerate((got.lo, got.hi, got.count, got.mean_score, got.rate, got.stderr)):
        np.testing.assert_allclose(got_col, w[:, j], rtol=1e-12, atol=1e-12)
    assert got.count.sum() == len(s)
    if not ties:  # equal-count bins
        assert got.count.min() >= len(s) // 10 - 1 and got.count.max() <= len(s) // 10 + 1


def test_calibration_of_equal_scores_is_one_bin():
    got = calibration_bins(np.full(7, 0.2), np.array([1, 0, 0, 0, 0, 1, 0]))
    assert got.count.tolist() == [7] and got.rate[0] == pytest.approx(2 / 7) and got.mean_score[0] == pytest.approx(0.2)


def test_score_histograms_count_each_label():
    s, y = _scores(3000, 4, False)
    edges, neg, pos = score_histograms(s, y, bins=20)
    assert edges[0] == s.min() and edges[-1] == pytest.approx(s.max())
    for counts, lab in ((neg, 0), (pos, 1)):
        want = [sum(1 for v, t in zip(s, y) if t == lab and (edges[k] <= v < edges[k + 1] or
                                                              (k == 19 and v == edges[-1]))) for k in range(20)]
        assert counts.tolist() == want


def test_group_aucs_are_sklearns_per_group():
    s, y = _scores(3000, 5, False)
    g = np.random.default_rng(5).integers(0, 40, 3000)
    g[g == 7] = 7
    y[g == 3] = 1  # one class: skipped
    auc, n, skipped = group_aucs(s, y, g)
    want = [(sklearn_metrics.roc_auc_score(y[g == k], s[g == k]), (g == k).sum()) for k in np.unique(g)
            if 0 < y[g == k].sum() < (g == k).sum()]
    assert skipped == 1
    np.testing.assert_allclose(auc, [a for a, _ in want], atol=1e-12)
    np.testing.assert_array_equal(n, [m for _, m in want])


# ---- pages of fabricated runs -----------------------------------------------------------------------
def _png_ok(path: Path) -> np.ndarray:
    """The PNG's pixels, after checking its size and that it holds a drawing (not one flat colour)."""
    img = imread(path)[..., :3]
    assert img.shape[:2] == (SIZE_PX[1], SIZE_PX[0]), path
    grey = img.mean(axis=2)
    assert (grey < 0.9).mean() > 0.01 and grey.std() > 0.05, f"{path} looks blank"
    assert len(np.unique((img * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 20, f"{path}: too few colours"
    return img


def _img_srcs(page: Path) -> dict[str, str]:
    return dict(re.findall(r'<img class="plot" data-plot="([^"]+)" src="([^"]+)"', page.read_text()))


def test_report_of_a_run_has_every_section(tmp_path):
    run = make_fake_run(tmp_path)
    page = write_report(run)
    assert page == run / "report.html"
    srcs = _img_srcs(page)
    assert set(srcs) == RUN_PLOTS and all(v == f"report/{k}.png" for k, v in srcs.items())
    for src in srcs.values():
        _png_ok(run / src)
    text = page.read_text()
    for want in ("Run fake", "auc = 0.79 at step 60 (epoch 3)", "1,234 (720)", "4.8 KiB", "533.3",
                 "10 of 1,010 input rows", "dense &#x27;d0&#x27; is &lt;not&gt; a number",  # escaped
                 "<td>user</td><td>sparse</td><td class=\"num\">50</td>", "group id: group", "AVX2",
                 "over_arch: [16]", "lr: 0.001"):
        assert want in text, want
    assert "0.285" in text  # valid store: no label rate in its manifest, read from its label column
    assert "gauc_skipped_groups" not in text


def test_rerendering_replaces_the_plots_and_keeps_foreign_files_safe(tmp_path):
    run = make_fake_run(tmp_path)
    write_report(run)
    with np.load(run / "predictions.npz") as z:  # the rows lose their groups: no gauc.png any more
        np.savez(run / "predictions.npz", label=z["label"], score=z["score"])
    write_report(run)
    assert sorted(p.stem for p in (run / "report").iterdir()) == sorted(RUN_PLOTS - {"gauc"})
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no temporary folder left
    (run / "report" / "notes.txt").write_text("mine")
    with pytest.raises(JobError, match=r"report holds files the report did not write \(notes.txt\)"):
        write_report(run)
    assert (run / "report" / "notes.txt").read_text() == "mine"


def test_a_deleted_store_and_a_truncated_record_are_said_not_fatal(tmp_path):
    run = make_fake_run(tmp_path)
    shutil.rmtree(tmp_path / "stores-fake" / "test")
    lines = len((run / "metrics.jsonl").read_text().splitlines())
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "st')  # a run killed while writing
    (run / "summary.json").unlink()
    text = write_report(run).read_text()
    assert "stores-fake/test</td><td>-</td><td>-</td><td>-</td><td>no longer exists" in text
    assert f"skipped 1 unreadable line(s), first line {lines + 1}" in text
    assert "no summary.json: the run did not finish" in text
    assert set(_img_srcs(run / "report.html")) == RUN_PLOTS  # curves from metrics.jsonl, step axis


def test_retrieval_run_draws_its_ranking_metrics_and_says_why_no_roc(tmp_path):
    run = make_fake_run(tmp_path, task="retrieval")
    text = write_report(run).read_text()
    assert set(_img_srcs(run / "report.html")) == {"loss", "metrics"}
    assert "Valid hr@10, ndcg@10, mrr per evaluation" in text
    assert "retrieval run: no ROC, calibration or score plots" in text and "no predictions.npz" not in text


def test_ranking_run_without_predictions_says_so(tmp_path):
    run = make_fake_run(tmp_path)
    (run / "predictions.npz").unlink()
    assert "no predictions.npz in the run" in write_report(run).read_text()
    assert set(_img_srcs(run / "report.html")) == {"loss", "metrics"}


@pytest.mark.parametrize("case", ["one class", "one row", "equal scores"])
def test_degenerate_predictions_still_give_a_page(tmp_path, case):
    run = make_fake_run(tmp_path)
    n = 1 if case == "one row" else 500
    label = np.zeros(n, np.float32) if case != "equal scores" else (np.arange(n) % 4 == 0).astype(np.float32)
    score = np.full(n, 0.3, np.float32) if case == "equal scores" else np.linspace(0.01, 0.2, n, dtype=np.float32)
    np.savez(run / "predictions.npz", label=label, score=score, group=np.arange(n) % 7)
    text = write_report(run).read_text()
    plots = set(_img_srcs(run / "report.html"))
    if case == "equal scores":
        assert {"roc", "calibration", "scores", "gauc"} <= plots
        for name in ("roc", "calibration", "scores"):
            _png_ok(run / "report" / f"{name}.png")
    else:
        assert "no ROC curve: the ROC curve needs both classes" in text and "roc" not in plots
        assert "no per-group AUC: none of the" in text and "gauc" not in plots


@pytest.mark.parametrize("make", ["missing", "file", "empty"])
def test_a_path_that_is_not_a_run_is_named(tmp_path, make, caplog):
    p = tmp_path / "x"
    if make == "file":
        p.write_text("")
    elif make == "empty":
        p.mkdir()
    why = {"missing": "does not exist", "file": "is a file", "empty": "is not a ctrkit run directory"}[make]
    with pytest.raises(JobError, match=f"{re.escape(str(p))}.*{why}.*summary.json, metrics.jsonl"):
        write_report(p)
    assert main(["report", str(p)]) == 2 and why in caplog.text


def test_compare_page_and_cli(tmp_path, capsys):
    a, b = make_fake_run(tmp_path, "a", seed=0), make_fake_run(tmp_path, "b", seed=3)
    out = tmp_path / "cmp.html"
    assert main(["report", str(a), str(b), "--out", str(out)]) == 0
    assert f"report: {out}" in capsys.readouterr().out
    text = out.read_text()
    srcs = _img_srcs(out)
    assert set(srcs) == {"metric", "loss", "roc"} and all(v.startswith("data:image/png;base64,") for v in srcs.values())
    assert "<th>valid auc</th>" in text and "<td>train.lr</td><td>0.001</td><td>0.004</td>" in text
    assert '<td class="num"><b>0.82</b></td>' in text  # b's best valid AUC is the better one: bold
    out.write_text("mine")
    assert main(["report", str(a), str(b), "--out", str(out)]) == 2 and out.read_text() == "mine"
    with pytest.raises(StoreError, match="choose another --out or pass --overwrite"):
        compare_report([a, b], out)
    assert main(["report", str(a), str(b), "--out", str(out), "--overwrite"]) == 0 and "<html" in out.read_text()
    with pytest.raises(JobError, match="given twice"):
        compare_report([a, tmp_path / "runs" / ".." / "runs" / "a"], tmp_path / "c2.html")
    single = tmp_path / "a.html"  # one run to a file of its own: self-contained
    assert main(["report", str(a), "--out", str(single)]) == 0
    assert all(v.startswith("data:") for v in _img_srcs(single).values()) and len(_img_srcs(single)) == 6


# ---- end to end: real trainings, rendered by Chromium -------------------------------------------------
SPEC = {"label": "label", "group_id": "u", "dense": [{"name": "x", "transform": "standardize"}],
        "sparse": [{"name": "u", "embedding_dim": 8}, {"name": "i", "embedding_dim": 8}]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two small DLRM runs (different lr) on a CSV with user groups, preprocessed by `preprocess table`."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from ctrkit.data.sources.table import preprocess_table
    from ctrkit.jobs.train import train_from_config
    from ctrkit.training.config import load_config

    d = tmp_path_factory.mktemp("report_e2e")
    rng = np.random.default_rng(0)
    n = 3000
    u, i, x = rng.integers(0, 60, n), rng.integers(0, 30, n), rng.normal(size=n)
    p = 1 / (1 + np.exp(-(1.2 * x + np.where(i % 3 == 0, 1.5, -1.0) + np.where(u % 4 == 0, 1.0, -0.5))))
    pacsv.write_csv(pa.table({"label": (rng.random(n) < p).astype(np.int64), "x": x.round(3),
                              "u": [f"u{k}" for k in u], "i": [f"i{k}" for k in i]}), d / "rows.csv")
    stores = preprocess_table(d / "rows.csv", SPEC, d / "st", split="0.6,0.2,0.2")
    runs = []
    for name, lr in (("a", "0.01"), ("b", "0.002")):
        cfg = load_config("configs/criteo/dlrm.yaml", [
            f"data.train={stores['train']}", f"data.valid={stores['valid']}", f"data.test={stores['test']}",
            f"run.dir={d / 'runs'}", f"run.name={name}", "train.epochs=3", f"train.lr={lr}", "data.batch_size=64",
            "train.log_every=5", "train.metrics=[auc,logloss,gauc]", "model.params.dense_arch=[8]",
            "model.params.over_arch=[8]", "train.progress=false"])
        train_from_config(cfg, progress=False)
        runs.append(d / "runs" / name)
    return d, runs


def _chromium(url: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp / 'chromium-profile'}", "--force-device-scale-factor=1", "--hide-scrollbars",
         "--force-color-profile=srgb", *args, url], capture_output=True, text=True, timeout=120, check=True)


PROBE = """<script>addEventListener("load", () => { const r = [...document.querySelectorAll("img.plot")].map(
  i => ({name: i.dataset.plot, x: i.getBoundingClientRect().left, y: i.getBoundingClientRect().top,
         w: i.clientWidth, h: i.clientHeight, loaded: i.complete && i.naturalWidth > 0}));
  document.body.dataset.probe = JSON.stringify({plots: r, height: document.documentElement.scrollHeight}); });
</script>"""


def _render(page: Path, tmp: Path) -> tuple[np.ndarray, list[dict]]:
    """Chromium's screenshot of ``page`` and where its plots are: a copy of the page beside it (same relative
    paths) with a script that records each <img class="plot">'s box is dumped first; the page itself is then
    shot with a window tall enough for all of it."""
    probe = page.with_name(f".probe-{page.name}")
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    try:
        dom = _chromium(probe.as_uri(), tmp, "--window-size=1200,3000", "--virtual-time-budget=5000",
                        "--dump-dom").stdout  # the width of the screenshot: the same layout
    finally:
        probe.unlink()
    found = re.search(r'data-probe="([^"]+)"', dom)
    assert found, "the probe script did not run"
    info = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    height = max(3000, int(info["height"]) + 10)
    shot = tmp / f"{page.stem}.screenshot.png"
    _chromium(page.as_uri(), tmp, f"--screenshot={shot}", f"--window-size=1200,{height}")
    return imread(shot)[..., :3], info["plots"]


def _check_shown(screen: np.ndarray, plots: list[dict], png_of: dict[str, np.ndarray]) -> None:
    """Each plot's box in the screenshot is loaded, non-blank, and shows that PNG pixel for pixel (within
    rounding of colours)."""
    assert screen.std() > 0.05
    for p in plots:
        assert p["loaded"], f"{p['name']}: the browser could not load the image"
        assert (p["w"], p["h"]) == SIZE_PX, p
        x, y = round(p["x"]) + 1, round(p["y"]) + 1  # inside the 1 px border
        crop = screen[y:y + SIZE_PX[1], x:x + SIZE_PX[0]]
        assert crop.shape[:2] == (SIZE_PX[1], SIZE_PX[0]), f"{p['name']} is outside the screenshot"
        grey = crop.mean(axis=2)
        assert (grey < 0.9).mean() > 0.01 and grey.std() > 0.05, f"{p['name']}: blank in the screenshot"
        assert np.abs(crop - png_of[p["name"]]).mean() < 0.01, f"{p['name']}: the screenshot shows another image"


def test_training_writes_a_report_that_chromium_renders(trained, tmp_path):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (`make test` installs the Debian package chromium)")
    _, (run, _) = trained
    page = run / "report.html"
    assert page.is_file(), "train_from_config wrote no report.html"
    summary = json.loads((run / "summary.json").read_text())
    srcs = _img_srcs(page)
    assert set(srcs) == RUN_PLOTS
    pngs = {k: _png_ok(run / v) for k, v in srcs.items()}
    text = page.read_text()
    assert f"{summary['test']['auc']:.5g}" in text and f"{summary['model_size']['parameters']:,}" in text
    screen, plots = _render(page, tmp_path)
    assert sorted(p["name"] for p in plots) == sorted(RUN_PLOTS)
    _check_shown(screen, plots, pngs)


def test_compare_of_two_trainings_renders_in_chromium(trained, tmp_path):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (`make test` installs the Debian package chromium)")
    import base64
    import io

    _, runs = trained
    out = tmp_path / "cmp.html"
    assert main(["report", *map(str, runs), "--out", str(out)]) == 0
    srcs = _img_srcs(out)
    assert set(srcs) == {"metric", "loss", "roc"}
    pngs = {k: _png_ok(io.BytesIO(base64.b64decode(v.split(",", 1)[1]))) for k, v in srcs.items()}
    screen, plots = _render(out, tmp_path)
    _check_shown(screen, plots, pngs)
