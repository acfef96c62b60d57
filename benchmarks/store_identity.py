"""Byte identity of preprocessed stores between two checkouts of ctrkit (e.g. a change and its base commit).

    python benchmarks/store_identity.py --reference-src ../base/src [--candidate-src src] [--workdir DIR]

Runs the same ``ctrkit preprocess`` commands (criteo: the bundled sample with a ratio split, as day files with
``--valid-from-test``, with ``--vocab-from``, and with small shuffle shards through the Python API; table:
MovieLens-100K with ``examples/movielens_100k.yaml``, with ``--vocab-from`` and with ``--valid`` / ``--test``
files; behaviour: the Taobao head with attributes, times, DIEN negatives and DSIN sessions, and an S3-Rec
slice) once per checkout, each in a subprocess with ``PYTHONPATH=<src>``, and compares every ``.npy`` column
of every store byte for byte (ids, values, row order after the shuffle), plus the row counts of the
manifests. Prints one line per case and a JSON summary; exits 1 on any difference.

Data: ``$CTRKIT_SHARED_DATA`` (default ``../shared/data`` beside the repository) for MovieLens and the
behaviour logs; a case whose data is missing fails loudly.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CRITEO = REPO / "examples" / "data" / "criteo_sample.tsv.gz"
CLI = "import sys; from ctrkit.cli import main; sys.exit(main(sys.argv[1:]))"
API_CRITEO = """
import sys
try:
    from ctrkit.data.sources.criteo import preprocess_criteo
except ImportError:  # the layout before data/ was split into pipeline / storage / sources
    from ctrkit.data.criteo import preprocess_criteo
preprocess_criteo(sys.argv[1], sys.argv[2], seed=7, shard_bytes=1 << 14, block_rows=256, progress=False, overwrite=True)
"""


def _run(src: Path, code: str, args: list[str], cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(src)}
    r = subprocess.run([sys.executable, "-c", code, *args], check=False, env=env, cwd=cwd, capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"{src}: {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")


def _inputs(work: Path, data: Path) -> dict[str, Path]:
    """The raw inputs every case reads, written once."""
    with gzip.open(CRITEO, "rt") as f:
        lines = f.read().splitlines(keepends=True)
    days = work / "days"
    days.mkdir(parents=True, exist_ok=True)
    for d in range(3):
        (days / f"day_{d}").write_text("".join(lines[d::3]))
    ml = work / "ml100k.csv"
    if not ml.exists():
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        subprocess.run([sys.executable, str(REPO / "examples" / "make_movielens_csv.py"), "--data",
                        str(data / "movielens_100k"), "--out", str(ml)], check=True, env=env, capture_output=True)
    rows = ml.read_text().splitlines(keepends=True)
    (work / "ml_train.csv").write_text("".join(rows[:60001]))
    (work / "ml_valid.csv").write_text(rows[0] + "".join(rows[60001:80001]))
    (work / "ml_test.csv").write_text(rows[0] + "".join(rows[80001:]))
    beauty = work / "beauty.txt"
    with gzip.open(data / "amazon_yelp_lastfm_sequences_s3rec" / "Beauty.txt.gz", "rt") as f:
        beauty.write_text("".join(f.readlines()[:2000]))
    return {"days": days, "ml": ml, "beauty": beauty}


def _cases(inp: dict[str, Path], data: Path) -> list[tuple[str, str, list[str]]]:
    """(name, code, arguments with OUT for the output directory and REF for the first case's train store)."""
    schema = str(REPO / "examples" / "movielens_100k.yaml")
    taobao = str(data / "taobao_userbehavior" / "UserBehavior_head.csv.gz")
    days = [str(inp["days"] / f"day_{d}") for d in range(3)]
    return [
        ("criteo_split", CLI, ["preprocess", "criteo", str(CRITEO), "--out", "OUT", "--seed", "3"]),
        ("criteo_days", CLI, ["preprocess", "criteo", *days, "--out", "OUT", "--valid-from-test"]),
        ("criteo_vocab_from", CLI, ["preprocess", "criteo", days[2], "--out", "OUT", "--split", "0.5,0.2,0.3",
                                    "--vocab-from", "REF:criteo_split"]),
        ("criteo_shards", API_CRITEO, [str(CRITEO), "OUT"]),
        ("criteo_min_freq_cap", CLI, ["preprocess", "criteo", *days, "--out", "OUT", "--min-freq", "2",
                                      "--max-vocab", "500", "--max-vocab-mode", "cap"]),
        ("criteo_hash", CLI, ["preprocess", "criteo", *days, "--out", "OUT", "--min-freq", "2", "--max-vocab", "700"]),
        ("criteo_workers_spill", CLI, ["preprocess", "criteo", *days, "--out", "OUT", "--workers", "2", "--min-freq",
                                       "2", "--vocab-memory-mb", "0.05", "--valid-from-test"]),
        ("table", CLI, ["preprocess", "table", str(inp["ml"]), "--schema", schema, "--out", "OUT"]),
        ("table_vocab_from", CLI, ["preprocess", "table", str(inp["ml"].parent / "ml_test.csv"), "--schema",
                                   schema, "--out", "OUT", "--split", "0.5,0.2,0.3", "--vocab-from", "REF:table"]),
        ("table_files", CLI, ["preprocess", "table", str(inp["ml"].parent / "ml_train.csv"), "--schema", schema,
                              "--out", "OUT", "--valid", str(inp["ml"].parent / "ml_valid.csv"), "--test",
                              str(inp["ml"].parent / "ml_test.csv"), "--seed", "5"]),
        ("behaviour_taobao", CLI, ["preprocess", "behaviour", taobao, "--out", "OUT", "--no-header", "--names",
                                   "user,item,category,type,timestamp", "--attr-cols", "category:cate",
                                   "--time-col", "timestamp", "--negatives", "popularity", "--aux-negatives",
                                   "--sessions", "2", "--max-len", "20", "--seed", "2"]),
        ("behaviour_s3rec", CLI, ["preprocess", "behaviour", str(inp["beauty"]), "--out", "OUT", "--format",
                                  "s3rec", "--item-attributes",
                                  str(data / "amazon_yelp_lastfm_sequences_s3rec" / "Beauty_item2attributes.json.gz")]),
    ]


def _columns(out: Path) -> dict[str, bytes]:
    """Every store column (``<split>/<column>.npy``, also inside column sub-directories) of a run."""
    found = {}
    for split in ("train", "valid", "test"):
        store = out / split
        if not store.is_dir():
            continue
        for p in sorted(store.rglob("*.npy")):
            rel = p.relative_to(store)
            if rel.parts[0] in ("pipeline", "vocab"):
                continue
            found[f"{split}/{rel}"] = p.read_bytes()
        found[f"{split}/num_rows"] = str(json.loads((store / "manifest.json").read_text())["num_rows"]).encode()
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference-src", required=True, help="src/ directory of the reference checkout")
    ap.add_argument("--candidate-src", default=str(REPO / "src"), help="src/ directory of the checkout to check")
    ap.add_argument("--workdir", default=None, help="keep inputs and stores here (default: a temporary directory)")
    a = ap.parse_args()
    data = Path(os.environ.get("CTRKIT_SHARED_DATA") or REPO.parent / "shared" / "data")
    with tempfile.TemporaryDirectory(prefix="ctrkit-identity-") as tmp:
        work = Path(a.workdir or tmp)
        inp = _inputs(work, data)
        summary: dict[str, object] = {}
        for name, code, args in _cases(inp, data):
            got = {}
            for side, src in (("reference", a.reference_src), ("candidate", a.candidate_src)):
                out = work / side / name
                argv = [str(out) if x == "OUT" else str(work / side / x[4:] / "train") if x.startswith("REF:")
                        else x for x in args]
                _run(Path(src).resolve(), code, argv + (["--overwrite"] if code == CLI else []), work)
                got[side] = _columns(out)
            ref, cand = got["reference"], got["candidate"]
            differ = sorted(k for k in ref.keys() | cand.keys() if ref.get(k) != cand.get(k))
            summary[name] = {"columns": len(ref), "differ": differ}
            print(f"{name}: {len(ref)} columns, {'identical' if not differ else f'DIFFER: {differ[:8]}'}")
        ok = all(not v["differ"] for v in summary.values())  # type: ignore[index]
        print(json.dumps({"identical": ok, "cases": summary}))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
