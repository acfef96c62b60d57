"""``ctrkit serve``, the command: one or several server processes (uvicorn) over one port.

``--workers N`` runs N processes started with ``spawn``, each loading its own copy of the model and running its
own event loop, micro-batcher and scoring thread, so the server's Python work (HTTP, JSON, validation, encoding)
is spread over the cores instead of holding one interpreter's lock. Processes rather than threads because that
work holds the GIL; ``spawn`` rather than ``fork`` so a worker never inherits a parent's torch thread pools or
CUDA state.

On Linux every worker listens on a socket of its own, all bound to the one port with ``SO_REUSEPORT``: the
kernel spreads new connections over the workers' sockets by a hash of the client's address and port. With one
shared socket (uvicorn's supervisor, used elsewhere) whichever worker wakes first accepts every pending
connection, and a burst of keep-alive clients all landed on one worker (measured: 32 of 32 connections, so two
workers served at one worker's rate; ``benchmarks/serve_load.py`` reports the split). The parent binds the
sockets, restarts a worker that dies while serving, and stops them all on SIGINT / SIGTERM.

The parent loads the checkpoint once before any worker starts, so that a bad checkpoint or option is one error
line (exit 2) rather than N failing workers; the workers read their options from the environment variable
:data:`OPTIONS_ENV` (JSON) that the parent sets, as uvicorn starts them from an import string
(:func:`worker_app`).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ctrkit.errors import ConfigError

log = logging.getLogger(__name__)

OPTIONS_ENV = "CTRKIT_SERVE_OPTIONS"
APP_FACTORY = "ctrkit.serving.command:worker_app"


def serve_options(args: argparse.Namespace) -> dict[str, Any]:
    """The checked options of ``ctrkit serve`` as plain data (what every worker builds its app from)."""
    from ctrkit.serving.live import default_since, newest_checkpoint
    from ctrkit.serving.options import default_threads

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    workers = args.workers
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    threads = args.threads if args.threads is not None else default_threads(workers)
    if threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}")
    checkpoint, watch = args.checkpoint, args.watch
    if watch is not None:
        if not Path(watch).is_dir():
            raise ConfigError(f"--watch {watch}: not a directory; give the directory new checkpoints are written to")
        if checkpoint is None:
            newest = newest_checkpoint(Path(watch))
            if newest is None:
                raise ConfigError(f"--watch {watch} holds no checkpoint (*.pt) to start with; write one there "
                                  "or give --checkpoint")
            checkpoint = str(newest)
    if checkpoint is None:
        raise ConfigError("serve needs --checkpoint (or --watch DIR holding one)")
    since = default_since(Path(checkpoint), Path(watch)) if watch is not None else None
    return {"checkpoint": str(checkpoint), "threads": threads, "workers": workers, "watch": watch,
            "watch_interval": args.watch_interval, "watch_since_ns": since, "max_rows": args.max_rows,
            "max_body_bytes": args.max_body_bytes, "max_batch_wait_ms": args.batch_wait_ms,
            "max_batch_rows": args.max_batch_rows, "log_level": logging.getLogger().getEffectiveLevel()}


def build_app(options: dict[str, Any]) -> Any:
    """The app of one worker: torch threads set, the checkpoint loaded and warmed, the watcher set up."""
    import torch

    from ctrkit.serving.live import Served, Watcher
    from ctrkit.serving.server import create_app

    torch.set_num_threads(options["threads"])
    served = Served.load(options["checkpoint"], batch_size=max(8192, options["max_batch_rows"]))
    app = create_app(served, max_rows=options["max_rows"], max_body_bytes=options["max_body_bytes"],
                     max_batch_wait_ms=options["max_batch_wait_ms"], max_batch_rows=options["max_batch_rows"])
    if options["watch"] is not None:
        service = app.state.service
        service.watcher = Watcher(service.live, options["watch"], interval=options["watch_interval"],
                                  batch_size=served.predictor.batch_size, since_ns=options["watch_since_ns"])
    # Everything loaded so far (torch, the model, the vocabularies: ~200k objects) lives as long as the server;
    # frozen, it is left out of the collector's full passes, which otherwise stall requests by ~0.1 s each.
    gc.collect()
    gc.freeze()
    log.info("worker %d serves %s (%s) with %d scoring thread(s)", os.getpid(), options["checkpoint"],
             served.predictor.info.get("model"), options["threads"])
    return app


def worker_app() -> Any:
    """uvicorn's app factory in a worker process: the app of the options the parent put in the environment."""
    raw = os.environ.get(OPTIONS_ENV)
    if raw is None:
        raise ConfigError(f"{APP_FACTORY} builds a worker of `ctrkit serve`, which sets {OPTIONS_ENV}; run "
                          "`ctrkit serve --workers N` instead")
    options = json.loads(raw)
    logging.basicConfig(level=options["log_level"], format="%(levelname)s %(name)s: %(message)s")  # as the CLI's
    return build_app(options)


def run_serve(args: argparse.Namespace) -> int:
    """Check the options and the checkpoint, then serve with uvicorn until interrupted."""
    import uvicorn

    options = serve_options(args)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("listening on %s: anyone who can reach it can score rows and read /metadata (no "
                    "authentication); use --host 127.0.0.1 or a proxy", args.host)
    common = {"host": args.host, "port": args.port, "log_level": "info", "access_log": args.access_log,
              "timeout_graceful_shutdown": 10}
    log.info("serving %s on http://%s:%d: %d worker(s), %d scoring thread(s) each%s", options["checkpoint"],
             args.host, args.port, options["workers"], options["threads"],
             f", watching {options['watch']}" if options["watch"] else "")
    if options["workers"] == 1:
        uvicorn.run(build_app(options), **common)
        return 0
    t = time.perf_counter()
    from ctrkit.serving.live import Served

    Served.load(options["checkpoint"])  # a bad checkpoint: one error here, not one per worker
    gc.collect()
    log.info("checkpoint verified in %.1f s; starting %d workers", time.perf_counter() - t, options["workers"])
    os.environ[OPTIONS_ENV] = json.dumps(options)
    if not balanced_sockets_supported():
        uvicorn.run(APP_FACTORY, factory=True, workers=options["workers"], **common)
        return 0
    return supervise(reuseport_sockets(args.host, args.port, options["workers"]), common)


def balanced_sockets_supported() -> bool:
    """Whether the kernel spreads connections over sockets sharing a port (Linux's SO_REUSEPORT; macOS has the
    option but gives every connection to one socket)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def reuseport_sockets(host: str, port: int, n: int) -> list[socket.socket]:
    """``n`` listening sockets on (host, port) with SO_REUSEPORT (port 0: the first one's free port for all)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets: list[socket.socket] = []
    try:
        for _ in range(n):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]
            sock.listen(2048)
            sock.set_inheritable(True)
    except OSError as e:
        for sock in sockets:
            sock.close()
        raise ConfigError(f"serve cannot listen on {host}:{port} ({e}); give another --port or --host") from None
    return sockets


def _worker(sock: socket.socket, common: dict[str, Any]) -> None:
    """(a spawned process) One uvicorn server of :func:`worker_app` on its own socket."""
    import uvicorn

    config = uvicorn.Config(APP_FACTORY, factory=True, **common)
    uvicorn.Server(config).run(sockets=[sock])


def supervise(sockets: list[socket.socket], common: dict[str, Any]) -> int:
    """Run one worker process per socket until SIGINT / SIGTERM; a worker that dies is started again on its
    socket (one that fails before the first has served stops the server: exit 1)."""
    ctx = multiprocessing.get_context("spawn")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    common = {k: v for k, v in common.items() if k not in ("host", "port")}

    def start(sock: socket.socket) -> Any:
        proc = ctx.Process(target=_worker, args=(sock, common), name="ctrkit-serve-worker")
        proc.start()
        return proc

    procs = [start(sock) for sock in sockets]
    started, code = time.monotonic(), 0
    try:
        while not stop.wait(0.5):
            for i, proc in enumerate(procs):
                if proc.is_alive():
                    continue
                if time.monotonic() - started < 60 and proc.exitcode not in (0, None):
                    log.error("worker %d failed while starting (exit %s); stopping the server", proc.pid,
                              proc.exitcode)
                    stop.set()
                    code = 1
                    break
                log.warning("worker %d exited (code %s); starting another on its socket", proc.pid, proc.exitcode)
                procs[i] = start(sockets[i])
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()  # SIGTERM: uvicorn's graceful shutdown
        deadline = time.monotonic() + common.get("timeout_graceful_shutdown", 10) + 5
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
        for sock in sockets:
            sock.close()
    return code
