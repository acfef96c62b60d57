"""``ctrkit serve``: /predict scores equal Predictor.predict on the same raw rows, every malformed request is a
4xx naming its row and field (and the server keeps serving), concurrent requests share model calls."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import require

require("fastapi", "serve")  # before the server's modules, which import it

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from serve_cases import sample_rows, train

from ctrkit.cli import main
from ctrkit.errors import Problem
from ctrkit.jobs.demo import SAMPLE
from ctrkit.serving import batching
from ctrkit.serving.batching import MicroBatcher
from ctrkit.serving.options import add_serve_args
from ctrkit.serving.predictor import Predictor
from ctrkit.serving.server import create_app

with warnings.catch_warnings():  # starlette asks for httpx2, which this environment does not have
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient


@pytest.fixture(scope="module")
def criteo_ckpt(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("serve_criteo")
    assert main(["preprocess", "criteo", str(SAMPLE), "--out", str(d / "criteo"), "--min-freq", "8",
                 "--embedding-dim", "8"]) == 0
    return train(d, d / "criteo/train", d / "criteo/valid")


TABLE_SPEC = {"label": "label", "dense": [{"name": "x", "transform": "standardize"}, {"name": "age"}],
              "sparse": [{"name": "u", "embedding_dim": 8}, {"name": "item", "embedding_dim": 8},
                         {"name": "tags", "multi_valued": True, "delimiter": "|", "embedding_dim": 8}]}


@pytest.fixture(scope="module")
def table_ckpt(tmp_path_factory) -> Path:
    """A DLRM on a Parquet table: string user 'u', integer 'item', multi-valued 'tags'."""
    from ctrkit.data.sources.table import preprocess_table

    d = tmp_path_factory.mktemp("serve_table")
    rng = np.random.default_rng(0)
    n = 600
    u = rng.integers(0, 30, n)
    pq.write_table(pa.table({
        "label": (rng.random(n) < np.where(u % 3 == 0, 0.8, 0.2)).astype(np.int64),
        "x": rng.normal(5, 2, n).round(3), "age": rng.integers(18, 80, n),
        "u": [f"user{k}" for k in u], "item": rng.integers(0, 20, n),
        "tags": ["|".join(f"t{t}" for t in rng.integers(0, 9, rng.integers(0, 4))) for _ in range(n)],
    }), d / "rows.parquet")
    stores = preprocess_table(d / "rows.parquet", TABLE_SPEC, d / "st", split="0.8,0.2,0")
    return train(d, stores["train"], stores["valid"])


@pytest.fixture(scope="module")
def criteo(criteo_ckpt):
    """(predictor, app, client) over the Criteo checkpoint; the client runs the app's lifespan."""
    predictor = Predictor.from_checkpoint(criteo_ckpt)
    app = create_app(predictor, max_rows=50, max_body_bytes=64 << 10)
    with TestClient(app) as client:
        yield predictor, app, client


ROWS = sample_rows(40)


def post(client, body) -> httpx.Response:
    return client.post("/predict", content=body if isinstance(body, (bytes, str)) else json.dumps(body))


def assert_serving(client, predictor) -> None:
    """The server still answers a valid request, with Predictor.predict's scores."""
    r = post(client, ROWS[:7])
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["scores"], predictor.predict(ROWS[:7]), rtol=1e-6, atol=1e-7)


# ---- scores -----------------------------------------------------------------------------------------------
def test_criteo_scores_equal_predictor_predict(criteo):
    predictor, _, client = criteo
    r = post(client, ROWS)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["model"] == "dlrm" and len(out["scores"]) == len(ROWS)
    want = predictor.predict(ROWS)
    np.testing.assert_allclose(out["scores"], want, rtol=1e-6, atol=1e-7)
    assert len(np.unique(want)) > 1
    # the same rows as {"rows": [...]}, counts as their text (as in a file), upper-case keys, extra fields
    alt = [{**row, **{f"I{i}": "" if row[f"I{i}"] is None else f"{row[f'I{i}']}" for i in range(1, 14)},
            **{f"C{i}": row[f"C{i}"].upper() for i in range(1, 27) if row[f"C{i}"] is not None},
            "my_request_id": k, "label": None} for k, row in enumerate(ROWS)]
    r = post(client, {"rows": alt, "ignored": True})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["scores"], want, rtol=1e-6, atol=1e-7)
    # what `ctrkit predict` refuses in a file is refused here too: a count with spaces, a key as an integer
    for field, value in (("I1", " 5 "), ("C1", 0x68FD1E64), ("C1", "0x68fd1e")):
        r = post(client, [{**ROWS[0], field: value}])
        assert r.status_code == 422 and f"field {field!r}" in r.text, (field, value, r.text)
    # empty strings as missing values and upper-case hex
    alt = [{**row, "C3": "", "I2": None, "C9": row["C9"].upper()} for row in ROWS[:9]]
    r = post(client, alt)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["scores"], predictor.predict(alt), rtol=1e-6, atol=1e-7)
    version = predictor.metadata()["checkpoint_sha256"]
    assert out["version"] == version and version.startswith("sha256:")  # the checkpoint that scored
    assert post(client, []).json() == {"scores": [], "model": "dlrm", "version": version}


def table_rows(n: int, seed: int = 1) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": float(rng.normal(5, 2)), "age": int(rng.integers(18, 80)), "u": f"user{rng.integers(0, 40)}",
             "item": int(rng.integers(0, 25)),
             "tags": "|".join(f"t{t}" for t in rng.integers(0, 12, rng.integers(0, 5)))} for _ in range(n)]


def test_table_scores_equal_predictor_predict(table_ckpt):
    predictor = Predictor.from_checkpoint(table_ckpt)
    rows = table_rows(30) + [{"x": None, "age": "", "u": None, "item": None, "tags": None}]
    want = predictor.predict(rows)
    assert len(np.unique(want)) > 1
    # tags as lists (with an empty token and a null), items as strings or integral floats: the same rows
    alt = [{**r, "tags": [t for t in (r["tags"] or "").split("|")] + [None],
            "item": (str(r["item"]) if k % 2 else float(r["item"])) if r["item"] is not None else None}
           for k, r in enumerate(rows)]
    with TestClient(create_app(predictor)) as client:
        for body in (rows, alt):
            r = post(client, body)
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(r.json()["scores"], want, rtol=1e-6, atol=1e-7)
        r = post(client, [{**rows[0], "tags": {"t1": 1}}, {**rows[1], "u": [1]}, {**rows[2], "tags": ["a", 1.5]},
                          {**rows[3], "x": 1e39}, {**rows[4], "u": "\ud800"}])
        assert r.status_code == 422
        errors = r.json()["errors"]
        assert [(e["row"], e["field"]) for e in errors] == [(0, "tags"), (1, "u"), (2, "tags"), (3, "x"), (4, "u")]
        assert "item 1 must be a string or an integer; got the number 1.5" in errors[2]["message"]
        assert "beyond the float32 range the model reads" in errors[3]["message"]
        assert "lone UTF-16 surrogate" in errors[4]["message"]


def test_ids_pipeline_rows_hold_ids():
    from conftest import contract_schema

    from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
    from ctrkit.models.registry import create_model

    schema = contract_schema()
    model = create_model("dlrm", schema, dense_arch=(8,), over_arch=(8,))
    predictor = Predictor(model, FeaturePipeline.from_schema(schema), info={"model": "dlrm"})
    rng = np.random.default_rng(0)
    rows = [{"d0": float(rng.normal()), "d1": 1, "d2": None, "user": int(rng.integers(0, 50)), "item": 3,
             "cat": 11, "ctx": None, "tags": [int(t) for t in rng.integers(0, 20, k)],
             "hist_item": [1, 2, 39][:k]} for k in range(4)]
    with TestClient(create_app(predictor)) as client:
        r = post(client, rows)
        assert r.status_code == 200, r.text
        want = predictor.predict([{**row, "ctx": 0, "d2": math.nan} for row in rows])
        np.testing.assert_allclose(r.json()["scores"], want, rtol=1e-6, atol=1e-7)
        r = post(client, [{**rows[0], "item": 40}, {**rows[1], "tags": [1, 20]}])
        assert r.status_code == 422
        assert [(e["row"], e["field"]) for e in r.json()["errors"]] == [(0, "item"), (1, "tags")]
        assert "[0, 40)" in r.json()["errors"][0]["message"]


# ---- each value checked once ------------------------------------------------------------------------------
ENCODER_CHECKS = ("numeric", "within_f32", "hex_keys", "to_string", "tokens")  # the encoder's column checks


def count_checks(monkeypatch) -> dict[str, int]:
    """Counts of the rule checks from here on: the validator's pass over a request (RowValidator.check) and the
    encoder's column checks (each call of one of ENCODER_CHECKS on a column)."""
    from ctrkit.data.pipeline import encode
    from ctrkit.serving.validation import RowValidator

    calls = {"validator": 0, "encoder": 0}

    def counting(f, who):
        def wrapped(*args, **kwargs):
            calls[who] += 1
            return f(*args, **kwargs)
        return wrapped

    for name in ENCODER_CHECKS:
        monkeypatch.setattr(encode, name, counting(getattr(encode, name), "encoder"))
    monkeypatch.setattr(RowValidator, "check", counting(RowValidator.check, "validator"))
    return calls


@pytest.mark.parametrize("kind", ["criteo", "table"])
def test_a_request_is_checked_once(kind, criteo_ckpt, table_ckpt, monkeypatch):
    """One validation pass per request and no second check in the encoder, with the scores the checked path gives
    (bit for bit): dense numbers, Criteo keys, categories and multi-valued tokens."""
    from ctrkit.serving.validation import RowValidator, to_arrays

    predictor = Predictor.from_checkpoint(criteo_ckpt if kind == "criteo" else table_ckpt)
    rows = ROWS if kind == "criteo" else table_rows(30) + [{"x": None, "age": "", "u": None, "item": 3,
                                                            "tags": ["t1", " ", None]}]
    checked = RowValidator(predictor.pipeline).check(rows)
    want = predictor.score(to_arrays(RowValidator(predictor.pipeline).rules, checked.columns)).scores
    with TestClient(create_app(predictor)) as client:
        calls = count_checks(monkeypatch)
        for k in range(3):
            r = post(client, rows)
            assert r.status_code == 200, r.text
            np.testing.assert_array_equal(np.array(r.json()["scores"], np.float32), want)
            assert calls == {"validator": k + 1, "encoder": 0}
        r = post(client, [{**rows[0], "I1" if kind == "criteo" else "x": "seven"}])
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == ("I1" if kind == "criteo" else "x")
        assert calls == {"validator": 4, "encoder": 0}
    predictor.predict(rows[:2])  # raw rows, not validated: the encoder checks them (the counter sees its checks)
    assert calls["encoder"] > 0


# ---- refused requests -------------------------------------------------------------------------------------
def with_value(field: str, value) -> bytes:
    """ROWS[:3] as JSON with row 1's ``field`` set to ``value`` (raw JSON text)."""
    rows = [dict(r) for r in ROWS[:3]]
    rows[1][field] = "@@"
    return json.dumps(rows).replace('"@@"', value).encode()


def without(field: str) -> list[dict]:
    rows = [dict(r) for r in ROWS[:3]]
    del rows[1][field]
    return rows


@pytest.mark.parametrize("body, field, message", [
    (without("C7"), "C7", "row 1 lacks the required field 'C7'; send null for a missing value"),
    (with_value("I3", '{"a": 1}'), "I3", ("must be an integer of at most 18 digits (a JSON integer, or its digits in a "
                                          "string: \"42\", \"-1\"), \"\" or null (missing); got an object")),
    (with_value("I3", "[1, 2]"), "I3", "got a list"),
    (with_value("I3", "true"), "I3", "got true"),
    (with_value("I3", '"12abc"'), "I3", 'got the string "12abc"'),
    (with_value("I3", '"1e400"'), "I3", 'got the string "1e400"'),
    (with_value("I3", '" 7 "'), "I3", 'got the string " 7 "'),  # `ctrkit predict` refuses it in a file too
    (with_value("I3", "2.5"), "I3", "got the number 2.5"),
    (with_value("I3", "NaN"), "I3", "got NaN (not a finite number; JSON has no NaN / Infinity)"),
    (with_value("I3", "Infinity"), "I3", "got Infinity (not a finite number"),
    (with_value("I3", "-Infinity"), "I3", "got -Infinity (not a finite number"),
    (with_value("I3", "1e400"), "I3", "got inf (a number too large for a 64-bit float)"),
    (with_value("I3", "1" * 400), "I3", "more than 18 digits; a Criteo count has at most 18"),
    (with_value("C2", '"68fd1e6g"'), "C2", "must be 8 hex digits in a string (e.g. \"68fd1e64\")"),
    (with_value("C2", '"0x8fd1e6"'), "C2", "must be 8 hex digits"),  # int(..., 16) would take it
    (with_value("C2", '"68fd1e6"'), "C2", 'got the string "68fd1e6"'),
    (with_value("C2", '"+8fd1e64"'), "C2", "must be 8 hex digits"),
    (with_value("C2", '"\\u0668\\u0668fd1e64"'), "C2", "must be 8 hex digits"),
    (with_value("C2", "4294967296"), "C2", ("8 hex digits in a string (e.g. \"68fd1e64\"), \"\" or null (missing); got the "
                                           "number 4294967296")),
    (with_value("C2", "1759059556"), "C2", "got the number 1759059556"),  # not the key the text "1759059556" is
    (with_value("C2", "[\"68fd1e64\"]"), "C2", "got a list"),
    (with_value("C2", "NaN"), "C2", "got NaN (not a finite number; JSON has no NaN / Infinity)"),
])
def test_a_bad_value_is_a_422_naming_row_and_field(criteo, body, field, message):
    predictor, _, client = criteo
    r = post(client, body)
    assert r.status_code == 422, r.text
    out = r.json()
    assert out["error"] == "invalid_rows" and out["invalid_rows"] == 1
    assert [(e["row"], e["field"]) for e in out["errors"]] == [(1, field)]
    assert message in out["errors"][0]["message"] and out["errors"][0]["message"] in out["message"]
    assert_serving(client, predictor)


def test_every_bad_row_and_field_is_listed(criteo):
    predictor, _, client = criteo
    rows = [dict(r) for r in ROWS[:6]]
    rows[1]["I1"], rows[1]["C1"] = "x", 5.5
    rows[3] = [1, 2]
    del rows[4]["I13"]
    r = post(client, rows)
    assert r.status_code == 422
    out = r.json()
    assert out["invalid_rows"] == 3 and "3 of 6 rows are invalid, so none was scored" in out["message"]
    assert [(e["row"], e["field"]) for e in out["errors"]] == [(1, "I1"), (1, "C1"), (3, None), (4, "I13")]
    assert "row 3 must be an object of field: value pairs; got a list" == out["errors"][2]["message"]
    assert_serving(client, predictor)


def test_the_error_list_is_capped(criteo):
    predictor = criteo[0]
    with TestClient(create_app(predictor, max_errors=3)) as client:
        r = post(client, [{**row, "I1": "x", "I2": "y"} for row in ROWS[:4]])
        out = r.json()
        assert r.status_code == 422 and out["invalid_rows"] == 4
        assert [(e["row"], e["field"]) for e in out["errors"]] == [(0, "I1"), (0, "I2"), (1, "I1")]
        assert "4 of 4 rows are invalid, so none was scored (3 of 8 errors listed)" in out["message"]


@pytest.mark.parametrize("body, status, error, message", [
    (b'[{"I1": 1,', 400, "malformed_json", "the body is not valid JSON"),
    (b"[\xff]", 400, "malformed_json", "not valid JSON"),
    (b"[" * 50_000, 400, "malformed_json", "nested too deeply"),
    (b"", 400, "malformed_json", "not valid JSON"),
    (b'{"row": []}', 422, "invalid_body", 'got an object without a "rows" list'),
    (b'"rows"', 422, "invalid_body", "got a JSON string"),
    (b"17", 422, "invalid_body", "got a JSON number"),
    (json.dumps(ROWS[:1] * 51).encode(), 413, "too_many_rows", "51 rows is more than this server's limit of 50"),
    (b"[" + b" " * (64 << 10) + b"]", 413, "body_too_large", "larger than this server's limit of 65536 bytes"),
])
def test_a_bad_body_is_a_4xx(criteo, body, status, error, message):
    predictor, _, client = criteo
    r = post(client, body)
    assert r.status_code == status, r.text
    assert r.json()["error"] == error and message in r.json()["message"]
    assert_serving(client, predictor)


def test_a_streamed_body_over_the_limit_is_refused_while_reading(criteo):
    predictor, _, client = criteo

    def chunks():  # no Content-Length header: chunked transfer, counted as it arrives
        for _ in range(1000):
            yield b" " * 1024

    r = client.post("/predict", content=chunks())
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"
    assert_serving(client, predictor)


def test_a_failing_model_call_is_a_json_500_and_the_server_keeps_serving(criteo_ckpt):
    from ctrkit.errors import DataError

    predictor = Predictor.from_checkpoint(criteo_ckpt)
    score = predictor.score_validated

    def flaky(rows):
        n = len(rows["I1"])
        if n == 2:
            raise DataError("rows lack something")
        if n == 3:
            raise RuntimeError("out of memory")
        return score(rows)

    predictor.score_validated = flaky
    with TestClient(create_app(predictor), raise_server_exceptions=False) as client:
        r = post(client, ROWS[:2])
        assert r.status_code == 422 and "rows lack something; fix the rows" in r.json()["message"]
        r = post(client, ROWS[:3])
        assert r.status_code == 500 and r.json()["error"] == "internal"
        assert "RuntimeError; see its log" in r.json()["message"]
        assert post(client, ROWS[:4]).status_code == 200


def test_a_bad_content_length_is_a_400(criteo):
    """Sent straight to the app (HTTP clients and uvicorn would not pass such a header on)."""
    app = criteo[1]
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"[]", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/predict", "raw_path": b"/predict", "root_path": "", "query_string": b"",
             "headers": [(b"content-length", "١٢".encode())], "client": ("127.0.0.1", 1), "server": ("t", 80)}
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["error"] == "bad_content_length"


# ---- micro-batching ---------------------------------------------------------------------------------------
def test_concurrent_requests_share_model_calls_and_get_their_own_scores(criteo_ckpt):
    predictor = Predictor.from_checkpoint(criteo_ckpt)
    calls = []
    score, score_validated = predictor.score, predictor.score_validated

    def counted(rows):
        calls.append(len(rows[next(iter(rows))]))
        return score_validated(rows)

    predictor.score_validated = counted
    app = create_app(predictor, max_batch_wait_ms=20)
    bodies = [sample_rows(k + 1, start=40 * k) for k in range(16)]
    bad = [{**bodies[3][0], "C4": "nothex!!"}]
    # one request gives its keys in upper case and its counts as text: merged with the others, all read the same
    sent = [*bodies[:8], bad, *bodies[8:]]
    sent[5] = [{**r, **{f"C{i}": r[f"C{i}"].upper() for i in range(1, 27) if r[f"C{i}"]},
                **{f"I{i}": str(r[f"I{i}"]) for i in range(1, 14) if r[f"I{i}"] is not None}} for r in sent[5]]

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport,
                                                                     base_url="http://t") as client:
            calls.clear()  # not the warm-up
            return await asyncio.gather(*(client.post("/predict", json=b) for b in sent))

    responses = asyncio.run(run())
    bad_response = responses.pop(8)
    assert bad_response.status_code == 422 and bad_response.json()["errors"][0]["field"] == "C4"
    assert 1 <= len(calls) < len(bodies) and sum(calls) == sum(map(len, bodies))
    for rows, r in zip(bodies, responses):
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["scores"], score(rows).scores, rtol=1e-6, atol=1e-7)
    assert app.state.batcher.stats.requests == len(bodies) + 1  # and the warm-up row


def test_batcher_returns_bad_rows_and_failures_to_their_own_request():
    """A scorer that marks rows bad (1-based, in the merged batch) and fails on one request's rows."""
    calls = []

    def score_fn(columns, n):
        calls.append(n)
        if "boom" in columns["v"]:
            raise ValueError("boom")
        bad = [Problem(k + 1, "v", f"bad {v}") for k, v in enumerate(columns["v"]) if v.startswith("bad")]
        return np.arange(n, dtype=np.float32), bad, f"call of {n}"

    async def run():
        batcher = MicroBatcher(score_fn, max_wait_s=0.05, max_rows=100)
        jobs = [["a", "b"], ["c", "bad-d"], ["boom"], ["bad-e", "f", "g"]]
        out = await asyncio.gather(*(batcher.score({"v": j}, len(j)) for j in jobs), return_exceptions=True)
        await batcher.stop()
        return out

    a, c, boom, e = asyncio.run(run())
    assert calls == [8, 2, 2, 1, 3]  # the merged call failed: each request alone
    assert a.bad == [] and a.scores.tolist() == [0, 1] and a.source == "call of 2"  # retried alone
    assert c.bad == [Problem(1, "v", "bad bad-d")] and c.scores.tolist() == [0, 1]
    assert isinstance(boom, ValueError)
    assert e.bad == [Problem(0, "v", "bad bad-e")] and e.scores.tolist() == [0, 1, 2]


class WaitClock:
    """Stands in for the batcher's clock: it is read only when a batch waits for more requests."""

    def __init__(self) -> None:
        self.reads = 0

    def monotonic(self) -> float:
        self.reads += 1
        return 0.0 if self.reads == 1 else 1e9  # the first read sets the deadline, the next one passes it


def test_a_lone_request_does_not_wait_for_a_batch(criteo_ckpt, monkeypatch):
    clock = WaitClock()
    monkeypatch.setattr(batching, "time", clock)
    predictor = Predictor.from_checkpoint(criteo_ckpt)
    with TestClient(create_app(predictor, max_batch_wait_ms=2000)) as client:
        assert post(client, ROWS[:5]).status_code == 200
    assert clock.reads == 0  # scored at once: no deadline was set

    async def two_at_once():  # the control: two requests queued together do wait (and read the clock)
        batcher = MicroBatcher(lambda cols, n: (np.zeros(n, np.float32), [], None), max_wait_s=2.0)
        batcher.start()
        out = await asyncio.gather(batcher.score({"v": [1]}, 1), batcher.score({"v": [2]}, 1))
        await batcher.stop()
        return out

    assert len(asyncio.run(two_at_once())) == 2 and clock.reads == 2


# ---- health and metadata ----------------------------------------------------------------------------------
def test_healthz_and_metadata(criteo, criteo_ckpt):
    _, _, client = criteo
    assert client.get("/healthz").json() == {"status": "ok"}
    meta = client.get("/metadata").json()
    assert meta["checkpoint_sha256"] == "sha256:" + hashlib.sha256(criteo_ckpt.read_bytes()).hexdigest()
    assert meta["model"] == "dlrm" and meta["model_params"]["dense_arch"] == [8]
    assert meta["input_columns"] == [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
    assert [f["kind"] for f in meta["input_fields"]] == ["count"] * 13 + ["hex"] * 26
    assert meta["server"]["limits"] == {"max_rows": 50, "max_body_bytes": 64 << 10, "max_batch_wait_ms": 2.0,
                                        "max_batch_rows": 4096, "max_errors": 1000}
    assert meta["server"]["batching"]["requests"] >= 1
    assert meta["schema"]["sparse"][0]["name"] == "C1" and "last_eval" in meta["training"]
    # no path of the serving machine: the checkpoint's file name and checksum only (issue 27, 5)
    assert meta["checkpoint"] == criteo_ckpt.name
    texts = []

    def strings(v):
        if isinstance(v, dict):
            for k, x in v.items():
                texts.append(str(k))
                strings(x)
        elif isinstance(v, list):
            for x in v:
                strings(x)
        elif isinstance(v, str):
            texts.append(v)

    strings(meta)
    parts = {str(criteo_ckpt.parent), str(criteo_ckpt.resolve().parent), str(Path.home()), os.getcwd()}
    assert not [t for t in texts if t.startswith("/") or any(p in t for p in parts)]


def test_healthz_is_503_before_the_lifespan_started(criteo):
    predictor, _, _ = criteo
    client = TestClient(create_app(predictor))  # no `with`: no lifespan, no warm-up
    r = client.get("/healthz")
    assert r.status_code == 503 and r.json() == {"status": "starting"}


def test_bad_limits_are_config_errors(criteo):
    from ctrkit.errors import ConfigError

    with pytest.raises(ConfigError, match="max_rows must be a number >= 1, got 0"):
        create_app(criteo[0], max_rows=0)


# ---- property: malformed input never breaks the server ----------------------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10 ** 30), 10 ** 30) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12) | st.sampled_from(["68fd1e64", "", "  7 ", "1e400", "0x1f", "\ud800", "-0"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
FIELDS = [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]


@st.composite
def mutated_rows(draw) -> list:
    rows = [dict(r) for r in draw(st.lists(st.sampled_from(ROWS[:10]), min_size=1, max_size=4))]
    for row in rows:
        for f in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
            if draw(st.booleans()):
                row.pop(f, None)
            else:
                row[f] = draw(JSON)
    return rows


BODIES = (mutated_rows().map(lambda r: json.dumps(r).encode())
          | JSON.map(lambda v: json.dumps(v).encode())
          | st.binary(max_size=64)
          | mutated_rows().map(lambda r: json.dumps(r).encode()).flatmap(
              lambda b: st.integers(0, len(b)).map(lambda k: b[:k])))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(body=BODIES)
def test_malformed_bodies_never_give_a_5xx(criteo, body):
    predictor, _, client = criteo
    r = post(client, body)  # the TestClient re-raises any server exception
    assert r.status_code in (200, 400, 413, 422), r.text
    out = r.json()
    event(f"{r.status_code} {out.get('error', '')}")
    if r.status_code == 200:
        data = json.loads(body)
        rows = data["rows"] if isinstance(data, dict) else data
        assert len(out["scores"]) == len(rows) and all(0 <= s <= 1 for s in out["scores"])
        try:  # where Predictor.predict reads the same rows too, the scores agree
            if not rows:
                raise ValueError("nothing to compare")
            want = predictor.predict([{f: row[f] for f in FIELDS} for row in rows])
        except ValueError:  # e.g. a key given as an integer beside hex strings: predict reads the column as text
            event("predict refused")
        else:
            np.testing.assert_allclose(out["scores"], want, rtol=1e-6, atol=1e-7)
    else:
        assert out["error"] and out["message"]
        for e in out.get("errors", []):
            assert isinstance(e["row"], int) and f"row {e['row']}" in e["message"]
    assert_serving(client, predictor)


# ---- a columnar body: {"columns": {field: [values]}} ------------------------------------------------------
def columnar(rows: list[dict], key: str = "columns") -> dict:
    """The rows as one list per field (every field of the first row, in reverse order: order does not matter)."""
    return {key: {f: [r[f] for r in rows] for f in reversed(list(rows[0]))}}


def answer(client, body) -> dict:
    r = post(client, body)
    return {"status": r.status_code, **r.json()}


def test_columns_score_as_rows_do(criteo):
    predictor, _, client = criteo
    want = answer(client, ROWS)
    assert want["status"] == 200 and len(want["scores"]) == len(ROWS)
    np.testing.assert_allclose(want["scores"], predictor.predict(ROWS), rtol=1e-6, atol=1e-7)
    for key in ("columns", "inputs"):
        got = answer(client, columnar(ROWS, key))
        assert got == want  # the same scores, bit for bit, and the same model and version
    # counts as text, upper-case keys, "" for missing, fields beyond the inputs: read as in a row
    alt = [{**r, "I2": "" if r["I2"] is None else str(r["I2"]), "C5": (r["C5"] or "").upper(), "mine": k}
           for k, r in enumerate(ROWS)]
    assert answer(client, columnar(alt)) == answer(client, alt)
    assert answer(client, {"columns": {f: [] for f in FIELDS}})["scores"] == []


def test_table_columns_score_as_rows_do(table_ckpt):
    """Strings, integers, a multi-valued field as lists and as delimited text, nulls."""
    predictor = Predictor.from_checkpoint(table_ckpt)
    rows = table_rows(20) + [{"x": None, "age": "", "u": None, "item": None, "tags": None}]
    as_lists = [{**r, "tags": (r["tags"] or "").split("|") + [None]} for r in rows]  # the same tags
    with TestClient(create_app(predictor)) as client:
        want = answer(client, rows)
        assert want["status"] == 200
        np.testing.assert_allclose(want["scores"], predictor.predict(rows), rtol=1e-6, atol=1e-7)
        assert answer(client, columnar(rows)) == want
        assert answer(client, columnar(as_lists)) == want


@pytest.mark.parametrize("field, value", [("I3", "seven"), ("I3", 2.5), ("C2", "68fd1e6g"), ("C2", 1759059556),
                                          ("C7", ["68fd1e64"]), ("I1", {"a": 1}), ("I13", True)])
def test_a_bad_value_is_named_by_its_row_and_field_as_in_a_row(criteo, field, value):
    client = criteo[2]
    rows = [dict(r) for r in ROWS[:5]]
    rows[3][field] = value
    rows[1]["I9"] = "x"
    want = answer(client, rows)
    assert want["status"] == 422 and [(e["row"], e["field"]) for e in want["errors"]] == [(1, "I9"), (3, field)]
    assert answer(client, columnar(rows)) == want


def test_columns_that_are_not_one_list_per_field_are_a_422_naming_them(criteo):
    client = criteo[2]
    cols = columnar(ROWS[:4])["columns"]
    del cols["C7"]
    cols["I4"] = 5
    cols["C1"] = cols["C1"][:3]
    out = answer(client, {"columns": cols})
    assert out["status"] == 422 and out["error"] == "invalid_columns"
    assert [(e["row"], e["field"]) for e in out["errors"]] == [(None, "I4"), (None, "C1"), (None, "C7")]
    messages = [e["message"] for e in out["errors"]]
    assert messages == ["column 'I4' must be a list with one value per row; got the number 5",
                        "column 'C1' holds 3 values, but the other columns hold 4; send one value per row",
                        "the columns lack the required field 'C7'; send a list of 4 values (null for a missing value)"]
    assert "(3 problem(s)), so none was scored" in out["message"] and messages[0] in out["message"]
    out = answer(client, {"columns": [1, 2]})
    assert out["status"] == 422 and "the columns must be an object of field: list of values; got a list" in \
        out["message"]
    out = answer(client, {**columnar(ROWS[:2]), "rows": ROWS[:2]})
    assert out["status"] == 422 and out["error"] == "invalid_body" and "both 'rows' and 'columns'" in out["message"]
    out = answer(client, columnar(ROWS[:1] * 51))
    assert out["status"] == 413 and "51 rows is more than this server's limit of 50" in out["message"]
    assert answer(client, columnar(ROWS[:3]))["status"] == 200  # and the server keeps serving


CELLS = st.none() | st.booleans() | st.integers(-(10 ** 20), 10 ** 20) | st.floats() | st.text(max_size=10) \
    | st.sampled_from(["68fd1e64", "68FD1E64", "", " 7", "-3", "0x12abcd", "\ud800"]) | st.lists(st.integers(), max_size=2)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(rows=st.lists(st.sampled_from(ROWS[:10]), min_size=1, max_size=4),
       changes=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(FIELDS), CELLS), max_size=4))
def test_any_rows_answer_the_same_as_columns(criteo, rows, changes):
    """Any values (well-formed or not) get the same answer in both layouts: scores, or the same errors."""
    client = criteo[2]
    rows = [dict(r) for r in rows]
    for i, field, value in changes:
        rows[i % len(rows)][field] = value
    assert answer(client, columnar(rows)) == answer(client, rows)


# ---- the command ------------------------------------------------------------------------------------------
def test_serve_args_defaults():
    import argparse

    p = argparse.ArgumentParser()
    add_serve_args(p)
    args = p.parse_args(["--checkpoint", "x.pt"])
    assert (args.host, args.port, args.max_rows, args.threads) == ("127.0.0.1", 8080, 4096, None)


@pytest.mark.slow
def test_uvicorn_serves_the_checkpoint(criteo_ckpt, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "ctrkit.cli", "serve", "--checkpoint", str(criteo_ckpt),
                             "--port", str(port), "--threads", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=1) as r:
                    if json.load(r) == {"status": "ok"}:
                        break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()
                time.sleep(0.1)
        req = urllib.request.Request(f"{url}/predict", data=json.dumps(ROWS[:5]).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            scores = json.load(r)["scores"]
        np.testing.assert_allclose(scores, Predictor.from_checkpoint(criteo_ckpt).predict(ROWS[:5]), rtol=1e-6)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
