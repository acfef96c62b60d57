"""``ctrkit serve``: an HTTP scoring server for a checkpoint (FastAPI on uvicorn).

Endpoints:

* ``POST /predict``: body a JSON list of raw row objects, ``{"rows": [...]}``, or the same rows column by column,
  ``{"columns": {"I1": [3, null, ...], "C1": ["68fd1e64", ...], ...}}`` (``"inputs"``, TF-Serving's name for its
  columnar format, is read the same way): one list of n values per input field, the layout DeepCTR's
  ``predict`` takes (a dict of one array per feature); it skips the per-row objects, so parsing and checking
  cost less (``benchmarks/serve_path.py``). The same columns as an Arrow IPC stream (``Content-Type:
  application/vnd.apache.arrow.stream``; e.g. ``pyarrow.ipc.new_stream`` of a table with a column per input
  field) are read from their buffers with no Python object per value (:meth:`RowValidator.check_arrow`); a
  column of another Arrow type than the usual one (counts as text, say) is read from its values as JSON would
  be, so the scores and the errors are those of the same values sent as JSON. Either way the answer is
  ``{"scores": [p_0, ..., p_n-1], "model": name, "version": "sha256:..."}``, one click probability per row, in
  order, and the version (checkpoint sha256) of the model that scored them all. A row holds the
  checkpoint's input fields (``GET /metadata`` lists them with what each accepts; the rules are those of
  :mod:`ctrkit.serving.validation`); fields beyond them (a label, the caller's own ids) are ignored.
* ``GET /healthz``: ``{"status": "ok"}`` once the model is loaded and warmed up; 503 before and during shutdown.
* ``GET /metadata``: :meth:`Predictor.metadata` (model, parameters, schema, training metrics, checkpoint
  sha256) plus the input fields, ``live`` (the checkpoint served, its version, swaps and refusals: hot reload,
  :mod:`ctrkit.serving.live`) and ``server`` (limits, this worker's batching counters and process id).

A request is scored whole or refused whole: one bad row refuses the request, listing every bad (row, field)
(up to ``max_errors``), so a client never gets scores misaligned with its rows. Errors are JSON
``{"error": code, "message": text}`` (row errors add ``"errors": [{"row": i, "field": f, "message": m}, ...]``
with 0-based row indices, and ``"invalid_rows"``):

====  ====================  =====================================================================
400   ``malformed_json``     the body is not JSON (or not UTF-8, or nested too deeply); Content-Type is not
                             checked
400   ``malformed_arrow``    the Content-Type is the Arrow stream's, and the body is not an Arrow IPC stream
400   ``bad_content_length`` a Content-Length header that is not a number
413   ``body_too_large``     more than ``max_body_bytes`` (Content-Length, or the bytes actually sent)
413   ``too_many_rows``      more than ``max_rows`` rows
422   ``invalid_body``       not a list of rows, nor an object with a "rows" list or a "columns" object (or both)
422   ``invalid_columns``    a columnar body lacking an input field, or holding one that is not a list or not
                             of the others' length, or (Arrow) twice (``errors`` names every such field, with
                             ``"row": null``)
422   ``invalid_rows``       rows that are not objects, lack an input field, or hold a value of the wrong
                             type, a non-finite number (NaN / Infinity tokens, 1e400), a non-hex Criteo key
500   ``internal``           a server failure (logged with its traceback); nothing was scored
====  ====================  =====================================================================

Concurrent requests are merged into one model call (:mod:`ctrkit.serving.batching`); each gets exactly the
scores it would get alone, and a bad request never affects the others. Several worker processes and the command
itself: :mod:`ctrkit.serving.command`.

There is no authentication: serve on 127.0.0.1 (the default) or behind a proxy that adds it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from ctrkit.errors import ConfigError, DataError, Problem, RowErrors
from ctrkit.serving.batching import MicroBatcher
from ctrkit.serving.live import LiveModel, Served, Watcher
from ctrkit.serving.options import (
    MAX_BATCH_ROWS,
    MAX_BATCH_WAIT_MS,
    MAX_BODY_BYTES,
    MAX_ERRORS,
    MAX_ROWS,
    WATCH_INTERVAL_S,
)
from ctrkit.serving.predictor import Predictor
from ctrkit.serving.validation import (
    ARROW_STREAM,
    BadColumns,
    Checked,
    column_arrays,
    column_lists,
    dumps,
    loads,
    read_arrow,
    render,
)

log = logging.getLogger(__name__)

COLUMNAR = ("columns", "inputs")  # a columnar body's key: ours, and TF-Serving's name for its columnar format
_INLINE_BYTES = 256 << 10  # larger bodies are parsed and validated in a thread, keeping the event loop free


class _Refused(Exception):
    """A request answered with a 4xx JSON error."""

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.code, "message": self.message, **self.extra}, status_code=self.status)


class _App(FastAPI):
    """FastAPI with ``POST /predict`` answered straight from the ASGI call (:meth:`_Service.predict_asgi`):
    its middleware stack and router took 6% of a worker's CPU at 32 clients (py-spy; ~0.09 ms a request), and
    /predict reads none of what they add. Every other path and method goes through FastAPI."""

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/predict" and scope["method"] == "POST":
            await self.state.service.predict_asgi(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(predictor: Predictor | Served, *, max_rows: int = MAX_ROWS, max_body_bytes: int = MAX_BODY_BYTES,
               max_batch_wait_ms: float = MAX_BATCH_WAIT_MS, max_batch_rows: int = MAX_BATCH_ROWS,
               max_errors: int = MAX_ERRORS, watch: str | Path | None = None,
               watch_interval: float = WATCH_INTERVAL_S) -> FastAPI:
    """The scoring app of ``predictor`` (see the module docstring); ``watch``: a directory whose newer
    checkpoints replace the model while serving (:mod:`ctrkit.serving.live`). Use it under a server that runs
    the ASGI lifespan (uvicorn; ``with TestClient(app)``) for warm-up, /healthz and the watcher; without one,
    micro-batching starts with the first request."""
    limits = {"max_rows": max_rows, "max_body_bytes": max_body_bytes, "max_batch_rows": max_batch_rows,
              "max_batch_wait_ms": max_batch_wait_ms, "max_errors": max_errors}
    for name, value in {**limits, "watch_interval": watch_interval}.items():
        low = 0 if name == "max_batch_wait_ms" else 1 if name != "watch_interval" else 0.01
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= low):
            raise ConfigError(f"serve: {name} must be a number >= {low}, got {value!r}")
    served = predictor if isinstance(predictor, Served) else Served.of(predictor)
    service = _Service(LiveModel(served), {k: float(v) if k == "max_batch_wait_ms" else int(v)
                                           for k, v in limits.items()})
    if watch is not None:
        service.watcher = Watcher(service.live, watch, interval=watch_interval,
                                  batch_size=served.predictor.batch_size)
    app = _App(title="ctrkit serve", version=str(served.predictor.info.get("ctrkit_version") or "0"),
                  lifespan=service.lifespan)
    app.state.batcher, app.state.live, app.state.service = service.batcher, service.live, service

    @app.exception_handler(_Refused)
    async def refused(request: Request, exc: _Refused) -> JSONResponse:
        return exc.response()

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> JSONResponse:  # logged by the server as well
        return _internal(exc)

    app.get("/healthz")(service.healthz)
    app.get("/metadata")(service.get_metadata)
    # /predict as a plain Starlette route too (what a GET or HEAD is refused by: 405), though _App answers POSTs
    app.router.add_route("/predict", service.predict, methods=["POST"])
    return app


class _Service:
    """What the app's endpoints share: the live model, the micro-batcher, the watcher and the limits.

    A request is validated once (:meth:`check`: the pipeline's column rules, through the live model's
    :class:`RowValidator`); its canonical columns are then encoded without a second check by whichever model is
    live when its micro-batch starts (a swap keeps the input fields, :func:`~ctrkit.serving.live.contract_change`)."""

    def __init__(self, live: LiveModel, limits: dict[str, Any]) -> None:
        self.live, self.limits = live, limits
        self.watcher: Watcher | None = None
        self.batcher = MicroBatcher(self.score_columns, max_wait_s=limits["max_batch_wait_ms"] / 1000,
                                    max_rows=limits["max_batch_rows"])
        self.ready = False

    @property
    def model_name(self) -> str:
        p = self.live.current.predictor
        return str(p.info.get("model") or type(p.model).__name__.lower())

    def score_columns(self, columns: dict[str, Any], n: int) -> tuple[np.ndarray, list[Problem], str]:
        """(worker thread) Validated canonical columns of n rows -> scores by the live model, and its version."""
        served = self.live.current  # once: the whole batch is scored by one model
        return served.score(columns, n), [], served.version

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        self.batcher.start()
        served = self.live.current
        warm = {r.column: None for r in served.validator.rules}  # one row of missing values: loads the code paths
        try:
            checked = served.validator.check([warm])
        except RowErrors as e:
            raise RuntimeError(f"warm-up row refused: {render(e.problems[0])}") from None
        await self.batcher.score(checked.columns, 1)
        watching = asyncio.create_task(self.watcher.run()) if self.watcher is not None else None
        self.ready = True
        log.info("ready: %s, %d input fields, limits %s%s", self.model_name, len(served.validator.rules),
                 self.limits, f", watching {self.watcher.directory}" if self.watcher else "")
        try:
            yield
        finally:
            self.ready = False
            if watching is not None:
                watching.cancel()
            await self.batcher.stop()

    async def healthz(self) -> JSONResponse:
        if self.ready and self.batcher.running:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "starting" if not self.ready else "stopping"}, status_code=503)

    async def get_metadata(self) -> JSONResponse:
        served = self.live.current
        server = {"limits": self.limits, "batching": self.batcher.stats.to_dict(), "worker_pid": os.getpid(),
                  "watch": str(self.watcher.directory) if self.watcher else None}
        return JSONResponse(json_safe({**served.predictor.metadata(), "input_fields": served.validator.fields(),
                                       "ignored_fields": "fields beyond input_fields (label, weight, ...) are "
                                       "ignored", "live": self.live.describe(), "server": server}))

    def check(self, body: bytes, media_type: str = "application/json") -> Checked:
        """Body -> its rows checked, or _Refused. ``media_type`` (Content-Type without parameters):
        :data:`ARROW_STREAM` reads an Arrow IPC stream, anything else JSON."""
        if media_type == ARROW_STREAM:
            return self._check_arrow(body)
        try:
            data = loads(body)
        except (ValueError, RecursionError) as e:
            detail = str(e) if not isinstance(e, RecursionError) else "nested too deeply"
            raise _Refused(400, "malformed_json", f"the body is not valid JSON ({detail[:200]}); send a JSON list "
                           f"of row objects (or an Arrow IPC stream with Content-Type: {ARROW_STREAM})") from None
        validator = self.live.current.validator
        keys = [k for k in ("rows", *COLUMNAR) if k in data] if type(data) is dict else []
        if len(keys) > 1:
            raise _Refused(422, "invalid_body", f"the body holds both {keys[0]!r} and {keys[1]!r}; send the rows "
                           "either as \"rows\" or as \"columns\"")
        if keys and keys[0] in COLUMNAR:
            try:
                values, n = column_lists(data[keys[0]], validator.names)
            except BadColumns as e:
                raise _bad_columns(e) from None
            self._check_rows(n)
            try:
                return validator.check_columns(values, n, self.limits["max_errors"])
            except RowErrors as e:
                raise _invalid_rows(e.problems, render, n, e.bad_rows, e.total) from None
        rows = data.get("rows") if type(data) is dict else data
        if not isinstance(rows, list):
            got = "an object without a \"rows\" list" if isinstance(data, dict) else f"a JSON {_json_type(data)}"
            raise _Refused(422, "invalid_body", f"the body must be a list of row objects, {{\"rows\": [...]}} or "
                           f"{{\"columns\": {{field: [values]}}}}; got {got}")
        self._check_rows(len(rows))
        try:
            return validator.check(rows, self.limits["max_errors"])
        except RowErrors as e:
            raise _invalid_rows(e.problems, render, len(rows), e.bad_rows, e.total) from None

    def _check_arrow(self, body: bytes) -> Checked:
        """An Arrow IPC stream body -> its rows checked, or _Refused."""
        try:
            batch = read_arrow(body)
        except ValueError as e:
            raise _Refused(400, "malformed_arrow", f"the body is not an Arrow IPC stream ({e}); send one stream "
                           "of record batches with a column per input field, or JSON with Content-Type: "
                           "application/json") from None
        self._check_rows(batch.num_rows)
        validator = self.live.current.validator
        try:
            columns = column_arrays(batch, validator.names)
        except BadColumns as e:
            raise _bad_columns(e) from None
        try:
            return validator.check_arrow(columns, batch.num_rows, self.limits["max_errors"])
        except RowErrors as e:
            raise _invalid_rows(e.problems, render, batch.num_rows, e.bad_rows, e.total) from None

    def _check_rows(self, n: int) -> None:
        if n > self.limits["max_rows"]:
            raise _Refused(413, "too_many_rows", f"{n} rows is more than this server's limit of "
                           f"{self.limits['max_rows']} per request; split them into several requests")

    async def predict_asgi(self, scope: dict, receive: Any, send: Any) -> None:
        """POST /predict as a bare ASGI call (see :class:`_App`): :meth:`predict`, its refusals and failures
        answered as FastAPI's handlers would."""
        try:
            response = await self.predict(Request(scope, receive))
        except _Refused as e:
            response = e.response()
        except Exception as e:
            log.exception("POST /predict failed")
            response = _internal(e)
        await response(scope, receive, send)

    async def predict(self, request: Request) -> Response:
        """POST /predict: {"scores": [...], "model": name, "version": the sha256 of the checkpoint that scored}."""
        body = await _read_body(request, self.limits["max_body_bytes"])
        media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        checked = (self.check(body, media) if len(body) <= _INLINE_BYTES
                   else await anyio.to_thread.run_sync(self.check, body, media))
        if checked.n == 0:
            return _json({"scores": [], "model": self.model_name, "version": self.live.current.version})
        try:
            res = await self.batcher.score(checked.columns, checked.n)
        except DataError as e:  # rows the pipeline refused as a whole (the checks above should prevent it)
            raise _Refused(422, "invalid_rows", f"{e}; fix the rows and send the request again") from None
        scores = res.scores.tolist()
        if not all(map(math.isfinite, scores)):
            raise RuntimeError(f"the model gave non-finite scores for valid rows: {scores[:5]}...")
        return _json({"scores": scores, "model": self.model_name, "version": res.source})


def _internal(exc: Exception) -> JSONResponse:
    return JSONResponse({"error": "internal", "message": f"the server failed on this request "
                         f"({type(exc).__name__}; see its log); nothing was scored"}, status_code=500)


def _bad_columns(e: BadColumns) -> _Refused:
    """The 422 answer to a columnar body whose columns are malformed (``e.problems``: every one)."""
    errors = [{"row": None, "field": f, "message": m} for f, m in e.problems]
    return _Refused(422, "invalid_columns", f"the body's columns are malformed ({len(errors)} problem(s)), so none "
                    f"was scored; fix them and send the request again. First: {errors[0]['message']}", errors=errors)


def _json(content: Any, status: int = 200) -> Response:
    return Response(dumps(content), status_code=status, media_type="application/json")


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it passes ``limit`` bytes: by its Content-Length header,
    else while reading (at most ``limit`` + one chunk is ever held)."""
    header = request.headers.get("content-length")
    if header is not None:
        try:
            length = int(header) if header.strip().isascii() else -1
        except ValueError:
            length = -1
        if length < 0:
            raise _Refused(400, "bad_content_length", f"Content-Length {header[:40]!r} is not a number of bytes")
        if length > limit:
            raise _Refused(413, "body_too_large", f"the body of {length} bytes is larger than this server's "
                           f"limit of {limit} bytes; send fewer rows per request")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _Refused(413, "body_too_large", f"the body is larger than this server's limit of {limit} "
                               "bytes; send fewer rows per request")
            chunks.append(chunk)
    except ClientDisconnect:  # the client left mid-body: nobody reads the answer
        raise _Refused(400, "client_disconnected", "the client closed the connection before sending the whole "
                       "body") from None
    return b"".join(chunks)


def _invalid_rows(problems: list[Problem], message: Any, n: int, bad_rows: int, total: int) -> _Refused:
    """The 422 answer listing ``problems`` (the first of ``total``; 0-based rows), each rendered by ``message``."""
    more = "" if len(problems) == total else f" ({len(problems)} of {total} errors listed)"
    errors = [{"row": p.row, "field": p.field, "message": message(p)} for p in problems]
    return _Refused(422, "invalid_rows", f"{bad_rows} of {n} rows are invalid, so none was scored{more}; fix them "
                    f"and send the request again. First: {errors[0]['message']}", errors=errors,
                    invalid_rows=bad_rows)


def _json_type(v: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(v), "number")


def json_safe(obj: Any) -> Any:
    """Plain JSON data: numpy scalars / arrays, tuples, sets and paths converted; non-finite floats -> None."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    if isinstance(obj, np.generic):
        return json_safe(obj.item())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)
