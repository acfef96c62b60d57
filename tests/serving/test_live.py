"""Hot reload (``ctrkit serve --watch DIR``): swaps under load give every request the whole scores of one of the
two models (never a mix, never a failure), a damaged checkpoint or one with other input fields is refused and
the live model keeps serving; and the server in several worker processes: every worker swaps, and a slow or
vanishing client does not hold up the others."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import require

require("fastapi", "serve")  # before the server's modules, which import it

import torch
from export_cases import tiny_checkpoint
from serve_cases import sample_rows, train

from ctrkit.checkpoint import Checkpoint
from ctrkit.cli import main
from ctrkit.errors import ConfigError
from ctrkit.jobs.demo import SAMPLE
from ctrkit.serving.command import balanced_sockets_supported, reuseport_sockets
from ctrkit.serving.live import Watcher, newest_checkpoint
from ctrkit.serving.predictor import Predictor
from ctrkit.serving.server import create_app

ROWS = sample_rows(60)


@pytest.fixture(scope="module")
def two_models(tmp_path_factory) -> tuple[Path, Path]:
    """Checkpoint A (a DLRM trained on the Criteo sample) and B: A with every weight moved by noise, so a model
    mixing A's and B's tensors would score neither's numbers."""
    d = tmp_path_factory.mktemp("live")
    assert main(["preprocess", "criteo", str(SAMPLE), "--out", str(d / "criteo"), "--min-freq", "8",
                 "--embedding-dim", "8"]) == 0
    a = train(d, d / "criteo/train", d / "criteo/valid")
    ck = Checkpoint.load(a)
    g = torch.Generator().manual_seed(3)
    ck.weights = {k: v + 0.3 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
                  for k, v in ck.weights.items()}
    return a, ck.save(d / "b.pt")


@pytest.fixture(scope="module")
def exact(two_models) -> dict[str, np.ndarray]:
    """{version: the scores of ROWS by that checkpoint, in process}; the two differ on every row."""
    out = {}
    for path in two_models:
        p = Predictor.from_checkpoint(path)
        out[p.checkpoint_sha256] = p.predict(ROWS)
    a, b = out.values()
    assert np.abs(a - b).min() > 1e-4
    return out


def publish(src: Path, directory: Path, name: str, mtime_ns: int) -> Path:
    """Copy ``src`` into ``directory`` as a writer would: a hidden temporary file, then a rename."""
    tmp = directory / f".{name}.tmp"
    tmp.write_bytes(src.read_bytes())
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    return tmp.rename(directory / name)


def assert_one_model(scores: list[float], version: str, rows: list[int], exact: dict[str, np.ndarray]) -> None:
    """The scores are those of the model named by ``version``, for every row of the request."""
    assert version in exact, version
    np.testing.assert_allclose(scores, exact[version][rows], rtol=1e-5, atol=1e-6)


def test_ten_swaps_under_load_give_only_whole_model_scores(two_models, exact, tmp_path):
    a, b = two_models
    watch = tmp_path / "watch"
    watch.mkdir()
    app = create_app(Predictor.from_checkpoint(a), watch=watch, watch_interval=3600, max_batch_wait_ms=1)
    watcher: Watcher = app.state.service.watcher
    seen: dict[str, int] = {}
    failures: list[str] = []

    async def client(k: int, c: httpx.AsyncClient, stop: asyncio.Event) -> None:
        rng = random.Random(k)
        while not stop.is_set():
            rows = rng.sample(range(len(ROWS)), rng.randint(1, 12))
            r = await c.post("/predict", json=[ROWS[i] for i in rows])
            if r.status_code != 200:
                failures.append(r.text)
                continue
            out = r.json()
            assert_one_model(out["scores"], out["version"], rows, exact)
            seen[out["version"]] = seen.get(out["version"], 0) + 1

    async def run() -> list[bool]:
        transport = httpx.ASGITransport(app=app)
        stop = asyncio.Event()
        async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport,
                                                                     base_url="http://t") as c:
            tasks = [asyncio.create_task(client(k, c, stop)) for k in range(4)]
            swapped = []
            t0 = time.time_ns()
            for k in range(10):
                publish(b if k % 2 == 0 else a, watch, f"m{k}.pt", t0 + (k + 1) * 10**9)
                swapped.append(await watcher.poll())
                await asyncio.sleep(0.05)  # requests on the new model
            stop.set()
            await asyncio.gather(*tasks)
            meta = (await c.get("/metadata")).json()
        return swapped, meta

    swapped, meta = asyncio.run(run())
    assert failures == []
    assert swapped == [True] * 10 and meta["live"]["swaps"] == 10
    assert meta["live"]["checkpoint"] == "m9.pt" and meta["live"]["version"] == meta["checkpoint_sha256"]
    assert set(seen) == set(exact) and min(seen.values()) >= 5, seen


def test_a_bad_checkpoint_is_refused_and_the_old_model_keeps_serving(two_models, exact, tmp_path, caplog):
    a, b = two_models
    watch = tmp_path / "watch"
    watch.mkdir()
    version_a, version_b = exact
    damaged = bytearray(b.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # one flipped byte in the weights
    other, *_ = tiny_checkpoint("deepfm", tmp_path / "other.pt")  # another schema: other input fields
    app = create_app(Predictor.from_checkpoint(a), watch=watch, watch_interval=3600)
    watcher: Watcher = app.state.service.watcher
    t0 = time.time_ns()

    async def run() -> None:
        transport = httpx.ASGITransport(app=app)
        async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport,
                                                                     base_url="http://t") as c:
            cases = [("damaged.pt", bytes(damaged), "fails its checksum"),
                     ("truncated.pt", b.read_bytes()[:5000], "could not be read as a checkpoint"),
                     ("other.pt", other.read_bytes(), "removes input fields ['C1'")]
            for k, (name, data, reason) in enumerate(cases):
                (watch / name).write_bytes(data)
                os.utime(watch / name, ns=(t0 + (k + 1) * 10**9,) * 2)
                with caplog.at_level(logging.ERROR, logger="ctrkit.serving.live"):
                    assert await watcher.poll() is False
                    assert await watcher.poll() is False  # not tried again while unchanged
                assert reason in caplog.text and name in caplog.text
                r = await c.post("/predict", json=ROWS)
                assert r.status_code == 200 and r.json()["version"] == version_a
                assert_one_model(r.json()["scores"], version_a, list(range(len(ROWS))), exact)
                meta = (await c.get("/metadata")).json()
                assert meta["live"]["version"] == version_a and meta["live"]["refused"][-1]["checkpoint"] == name
            publish(b, watch, "good.pt", t0 + 10 * 10**9)  # a good one after them is served
            assert await watcher.poll() is True
            r = await c.post("/predict", json=ROWS)
            assert r.json()["version"] == version_b

    asyncio.run(run())


def test_the_watcher_takes_only_new_visible_checkpoint_files(two_models, tmp_path):
    a, _ = two_models
    old = publish(a, tmp_path, "old.pt", time.time_ns() - 10**10)
    (tmp_path / ".half.pt").write_bytes(b"partial")  # a writer's hidden temporary file
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert newest_checkpoint(tmp_path) == old
    app = create_app(Predictor.from_checkpoint(a), watch=tmp_path, watch_interval=3600)
    assert asyncio.run(app.state.service.watcher.poll()) is False  # older than the server: not new
    with pytest.raises(Exception, match="not a directory"):
        create_app(Predictor.from_checkpoint(a), watch=tmp_path / "missing")


# ---- the server in worker processes -----------------------------------------------------------------------
def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def _post(url: str, rows: list[dict]) -> dict:
    req = urllib.request.Request(f"{url}/predict", data=json.dumps(rows).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:  # a new connection each time: both workers get some
        return json.load(r)


def _versions_by_worker(url: str, want: str, workers: int, timeout: float = 30) -> dict[int, str]:
    """Ask /metadata on new connections until ``workers`` processes have answered with version ``want``."""
    by_pid: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meta = _get(f"{url}/metadata")
        by_pid[meta["server"]["worker_pid"]] = meta["live"]["version"]
        if len(by_pid) == workers and set(by_pid.values()) == {want}:
            break
        time.sleep(0.02)
    return by_pid


def _pids_of_connections(port: int, n: int) -> set[int]:
    """The worker pids that answer /metadata on ``n`` connections opened before any is used."""
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    pids = set()
    try:
        for c in conns:
            c.sendall(b"GET /metadata HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := c.recv(65536):
                data += chunk
            pids.add(json.loads(data.split(b"\r\n\r\n", 1)[1])["server"]["worker_pid"])
    finally:
        for c in conns:
            c.close()
    return pids


def test_reuseport_sockets_share_a_port_and_name_a_taken_one():
    if not balanced_sockets_supported():
        pytest.skip("SO_REUSEPORT spreads connections on Linux only")
    socks = reuseport_sockets("127.0.0.1", 0, 3)
    try:
        assert len({s.getsockname() for s in socks}) == 1 and socks[0].getsockname()[1] > 0
        with socket.socket() as taken:  # a socket without SO_REUSEPORT holds the port
            taken.bind(("127.0.0.1", 0))
            port = taken.getsockname()[1]
            with pytest.raises(ConfigError, match=f"serve cannot listen on 127.0.0.1:{port} .*give another --port"):
                reuseport_sockets("127.0.0.1", port, 2)
    finally:
        for s in socks:
            s.close()


@pytest.mark.slow
def test_workers_all_swap_and_a_slow_client_stalls_nobody(two_models, exact, tmp_path):
    a, b = two_models
    watch = tmp_path / "watch"
    watch.mkdir()
    first = publish(a, watch, "m0.pt", time.time_ns() - 10**10)
    version_a, version_b = exact
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "ctrkit.cli", "serve", "--watch", str(watch), "--port", str(port),
                             "--workers", "2", "--threads", "1", "--watch-interval", "0.1"], stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if _get(f"{url}/healthz") == {"status": "ok"}:
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
                time.sleep(0.1)
        assert set(_versions_by_worker(url, version_a, 2).values()) == {version_a}
        assert _get(f"{url}/metadata")["live"]["checkpoint"] == first.name
        if balanced_sockets_supported():  # 16 connections opened at once reach both workers (a socket each)
            assert len(_pids_of_connections(port, 16)) == 2

        # a client that sends half its body and waits, one that leaves mid-body, one that never reads its answer
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n[{\"I1\": 1")
        gone = socket.create_connection(("127.0.0.1", port))
        gone.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n[{")
        gone.close()
        deaf = socket.create_connection(("127.0.0.1", port))
        body = json.dumps(ROWS).encode()
        deaf.sendall(b"".join(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                              for _ in range(50)))
        t = time.perf_counter()
        for _ in range(20):
            out = _post(url, ROWS[:10])
            assert_one_model(out["scores"], out["version"], list(range(10)), exact)
        assert time.perf_counter() - t < 20  # answered meanwhile (20 requests take well under a second)

        # 10 swaps under load from 3 threads: every answer is 200 with the whole scores of the model it names
        failures: list[str] = []
        stop = threading.Event()

        def load(k: int) -> None:
            rng = random.Random(k)
            while not stop.is_set():
                rows = rng.sample(range(len(ROWS)), rng.randint(1, 12))
                try:
                    out = _post(url, [ROWS[i] for i in rows])
                    assert_one_model(out["scores"], out["version"], rows, exact)
                except Exception as e:  # noqa: BLE001 - collected, reported below
                    failures.append(repr(e))

        threads = [threading.Thread(target=load, args=(k,)) for k in range(3)]
        for th in threads:
            th.start()
        t0 = time.time_ns()
        for k in range(1, 11):
            want = version_b if k % 2 else version_a
            publish(b if k % 2 else a, watch, f"m{k}.pt", t0 + k * 10**9)
            assert set(_versions_by_worker(url, want, 2).values()) == {want}, k  # every worker swapped
        stop.set()
        for th in threads:
            th.join()
        assert failures == []
        slow.close()
        deaf.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    text = (tmp_path / "server.log").read_text()
    assert text.count("now serves m10.pt") == 2, text[-3000:]  # each of the 2 workers


def test_serve_option_errors_are_one_line(tmp_path, caplog):
    cases = [([], "serve needs --checkpoint (or --watch DIR holding one)"),
             (["--watch", str(tmp_path / "none")], "not a directory"),
             (["--watch", str(tmp_path)], "holds no checkpoint (*.pt) to start with")]
    for extra, message in cases:
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            assert main(["serve", "--port", "0", *extra]) == 2
        assert message in caplog.text, (extra, caplog.text)
