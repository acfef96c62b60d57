"""POST /predict with an Arrow IPC stream body (``Content-Type: application/vnd.apache.arrow.stream``): the same
answer, bit for bit, as the same columns sent as JSON; the same (row, field) errors; a body that is not such a
stream, or lacks a field, is a 4xx naming what is wrong, and the server keeps serving."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest
from conftest import require

require("fastapi", "serve")  # before the server's modules, which import it

from serve_cases import sample_rows, train

from ctrkit.cli import main
from ctrkit.jobs.demo import SAMPLE
from ctrkit.serving.predictor import Predictor
from ctrkit.serving.server import create_app
from ctrkit.serving.validation import ARROW_STREAM

with warnings.catch_warnings():  # starlette asks for httpx2, which this environment does not have
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

FIELDS = [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
ROWS = sample_rows(40)


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    """(predictor, client) of a small DLRM on the Criteo sample; the client runs the app's lifespan."""
    d: Path = tmp_path_factory.mktemp("serve_arrow")
    assert main(["preprocess", "criteo", str(SAMPLE), "--out", str(d / "criteo"), "--min-freq", "8",
                 "--embedding-dim", "8"]) == 0
    predictor = Predictor.from_checkpoint(train(d, d / "criteo/train", d / "criteo/valid"))
    with TestClient(create_app(predictor, max_rows=50)) as client:
        yield predictor, client


def stream(table: pa.Table, max_chunksize: int | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table, max_chunksize=max_chunksize)
    return sink.getvalue().to_pybytes()


def arrow_of(rows: list[dict], types: dict[str, pa.DataType] | None = None) -> pa.Table:
    """The rows as an Arrow table: counts int64, keys string (``types`` overrides a field's type)."""
    types = types or {}
    return pa.table({f: pa.array([r.get(f) for r in rows], types.get(f)) for f in rows[0]})


def answer(client, body: bytes | dict, media: str = ARROW_STREAM) -> dict:
    if isinstance(body, dict):
        r = client.post("/predict", content=json.dumps(body))
    else:
        r = client.post("/predict", content=body, headers={"Content-Type": media})
    return {"status": r.status_code, **r.json()}


def columnar(rows: list[dict]) -> dict:
    return {"columns": {f: [r[f] for r in rows] for f in rows[0]}}


def test_arrow_scores_equal_the_json_answer(criteo):
    predictor, client = criteo
    want = answer(client, columnar(ROWS))
    assert want["status"] == 200
    np.testing.assert_allclose(want["scores"], predictor.predict(ROWS), rtol=1e-6, atol=1e-7)
    assert answer(client, stream(arrow_of(ROWS))) == want  # the same scores, bit for bit, model and version
    assert answer(client, stream(arrow_of(ROWS), max_chunksize=7)) == want  # several record batches
    # other integer widths, large strings, upper-case keys, fields beyond the inputs, columns in another order
    odd = {**{f"I{i}": pa.int32() for i in range(1, 14)}, "C3": pa.large_string(), "I2": pa.float64()}
    table = arrow_of([{**r, "C5": (r["C5"] or "").upper() or None, "mine": k} for k, r in enumerate(ROWS)], odd)
    assert answer(client, stream(table.select(table.column_names[::-1]))) == want
    # counts as text and keys as "" (the per-value path): the JSON answer of the same values
    text = [{**r, "I2": "" if r["I2"] is None else str(r["I2"]), "C7": r["C7"] or ""} for r in ROWS]
    assert answer(client, stream(arrow_of(text))) == answer(client, columnar(text)) == want
    empty = pa.table({f: pa.array([], pa.int64() if f[0] == "I" else pa.string()) for f in FIELDS})
    assert answer(client, stream(empty))["scores"] == []


@pytest.mark.parametrize("field, value", [("I3", "seven"), ("I3", 2.5), ("C2", "68fd1e6g"), ("C2", "68fd1e6"),
                                          ("I13", True), ("I5", 10**18)])
def test_a_bad_value_is_named_by_its_row_and_field_as_in_json(criteo, field, value):
    """The Arrow column holding the bad value is of that value's type (text, float, bool), as a client's table
    would be: its answer is the JSON answer of the column's values."""
    client = criteo[1]
    rows = [dict(r) for r in ROWS[:5]]
    rows[3][field] = value
    rows[1]["I9"] = "x"
    kind = {str: str, float: float, bool: bool, int: int}[type(value)]
    cols = {f: [r[f] for r in rows] for f in FIELDS}
    cols["I9"] = [None if v is None else str(v) for v in cols["I9"]]
    cols[field] = [None if v is None else kind(v) for v in cols[field]]
    table = pa.table(cols)
    want = answer(client, {"columns": table.to_pydict()})
    assert want["status"] == 422 and {(1, "I9"), (3, field)} <= {(e["row"], e["field"]) for e in want["errors"]}
    assert answer(client, stream(table)) == want


@pytest.mark.parametrize("body, status, error, message", [
    (b"", 400, "malformed_arrow", "the body is not an Arrow IPC stream"),
    (b"not arrow at all", 400, "malformed_arrow", "the body is not an Arrow IPC stream"),
    (json.dumps(ROWS[:2]).encode(), 400, "malformed_arrow", "or JSON with Content-Type: application/json"),
])
def test_a_body_that_is_not_an_arrow_stream_is_a_400(criteo, body, status, error, message):
    client = criteo[1]
    out = answer(client, body)
    assert (out["status"], out["error"]) == (status, error) and message in out["message"], out
    full = stream(arrow_of(ROWS[:3]))
    out = answer(client, full[: len(full) // 2])  # cut short
    assert out["status"] == 400 and out["error"] == "malformed_arrow"
    # the Arrow bytes sent without the Arrow media type are read as JSON, and the answer says how to send them
    out = answer(client, full, "application/octet-stream")
    assert out["status"] == 400 and out["error"] == "malformed_json" and ARROW_STREAM in out["message"]
    r = client.post("/predict", content=full, headers={"Content-Type": f"{ARROW_STREAM}; charset=binary"})
    assert r.status_code == 200 and len(r.json()["scores"]) == 3


def test_missing_or_repeated_fields_are_a_422_naming_them(criteo):
    predictor, client = criteo
    table = arrow_of(ROWS[:4]).drop_columns(["C7", "I2"])
    out = answer(client, stream(table))
    assert out["status"] == 422 and out["error"] == "invalid_columns"
    assert [(e["row"], e["field"]) for e in out["errors"]] == [(None, "I2"), (None, "C7")]
    assert out["errors"][0]["message"] == ("the columns lack the required field 'I2'; send a list of 4 values (null "
                                           "for a missing value)")
    twice = arrow_of(ROWS[:4]).append_column("C1", pa.array(["68fd1e64"] * 4))
    out = answer(client, stream(twice))
    assert out["status"] == 422 and out["errors"] == [{"row": None, "field": "C1", "message":
                                                       "the columns hold field 'C1' 2 times; send it once"}]
    out = answer(client, stream(arrow_of(ROWS[:1] * 51)))
    assert out["status"] == 413 and "51 rows is more than this server's limit of 50" in out["message"]
    r = client.post("/predict", json=ROWS[:7])  # and the server keeps serving
    np.testing.assert_allclose(r.json()["scores"], predictor.predict(ROWS[:7]), rtol=1e-6, atol=1e-7)


def test_arrow_and_json_requests_share_a_micro_batch(criteo):
    """Arrow and JSON requests merged into model calls get the scores each gets alone."""
    import asyncio

    predictor = criteo[0]
    app = create_app(predictor, max_batch_wait_ms=20)
    parts = [sample_rows(k + 3, start=30 * k) for k in range(8)]
    alone = [predictor.predict(p) for p in parts]

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport,
                                                                     base_url="http://t") as c:
            return await asyncio.gather(*(
                c.post("/predict", content=stream(arrow_of(p)), headers={"Content-Type": ARROW_STREAM}) if k % 2
                else c.post("/predict", json=columnar(p)) for k, p in enumerate(parts)))

    for r, want in zip(asyncio.run(run()), alone):
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["scores"], want, rtol=1e-6, atol=1e-7)
    assert app.state.batcher.stats.batches < len(parts) + 1  # merged (the warm-up row is one call)


TABLE_SPEC = {"label": "label", "dense": [{"name": "x", "transform": "standardize"}, {"name": "age"}],
              "sparse": [{"name": "u", "embedding_dim": 8}, {"name": "item", "embedding_dim": 8},
                         {"name": "tags", "multi_valued": True, "delimiter": "|", "embedding_dim": 8}]}


def test_table_columns_of_every_kind_answer_as_json(tmp_path):
    """Floats, integers, strings, a multi-valued field as a list<string> column and as delimited text, nulls:
    the Arrow answer is the JSON answer of the same columns."""
    import pyarrow.parquet as pq

    from ctrkit.data.sources.table import preprocess_table

    rng = np.random.default_rng(0)
    n = 300
    pq.write_table(pa.table({
        "label": rng.integers(0, 2, n), "x": rng.normal(5, 2, n).round(3), "age": rng.integers(18, 80, n),
        "u": [f"user{k}" for k in rng.integers(0, 30, n)], "item": rng.integers(0, 20, n),
        "tags": ["|".join(f"t{t}" for t in rng.integers(0, 9, rng.integers(0, 4))) for _ in range(n)],
    }), tmp_path / "rows.parquet")
    stores = preprocess_table(tmp_path / "rows.parquet", TABLE_SPEC, tmp_path / "st", split="0.8,0.2,0")
    predictor = Predictor.from_checkpoint(train(tmp_path, stores["train"], stores["valid"]))
    cols = {"x": [1.5, None, 7.25, -3.0], "age": [20, 33, None, 70], "u": ["user1", None, "user7", "nobody"],
            "item": [3, None, 19, 7], "tags": ["t1|t2", None, "", "t8"]}
    as_lists = {**cols, "tags": [["t1", "t2"], None, [], ["t8", None]]}
    with TestClient(create_app(predictor)) as client:
        for c in (cols, as_lists):
            want = answer(client, {"columns": c})
            assert want["status"] == 200 and len(want["scores"]) == 4
            assert answer(client, stream(pa.table(c))) == want
        bad = {**cols, "x": [1.0, float("nan"), 2.0, 1e39]}  # a NaN value (not a null) and one beyond float32
        out = answer(client, stream(pa.table(bad)))
        assert out["status"] == 422 and [(e["row"], e["field"]) for e in out["errors"]] == [(1, "x"), (3, "x")]


def test_predict_by_another_method_is_still_fastapis_405(criteo):
    """POST /predict skips FastAPI's stack; any other method on it still gets FastAPI's answer."""
    client = criteo[1]
    assert client.get("/predict").status_code == 405
    assert client.get("/healthz").json() == {"status": "ok"}
