"""The options of ``ctrkit serve`` and their defaults, apart from :mod:`ctrkit.serving.server` so that the command
line can list them without importing FastAPI (an optional dependency: ``pip install 'ctrkit[serve]'``)."""

from __future__ import annotations

import argparse
import os

from ctrkit.typecheck import NonNegativeFloat, Port, PositiveFloat, PositiveInt, cli_type

MAX_ROWS = 4096  # rows per request
MAX_BODY_BYTES = 8 << 20  # about 13,000 Criteo rows of raw JSON; parsing that takes ~0.1 s
MAX_BATCH_WAIT_MS = 2.0
MAX_BATCH_ROWS = 4096
MAX_ERRORS = 1000  # (row, field) errors listed in one response
WATCH_INTERVAL_S = 1.0  # how often --watch looks for a new checkpoint


def default_threads(workers: int = 1) -> int:
    """Intra-op threads for the model: one worker process takes all cores but one, which its event loop (HTTP,
    JSON) needs; several share the cores (at least 1 thread each)."""
    cores = os.cpu_count() or 2
    return max(1, cores - 1) if workers == 1 else max(1, cores // workers)


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", help="checkpoint to serve (e.g. runs/<name>/best.pt); with --watch, default: the "
                                        "newest *.pt of the watched directory")
    p.add_argument("--host", default="127.0.0.1",
                   help="interface to listen on (default 127.0.0.1; there is no authentication)")
    p.add_argument("--port", type=cli_type(Port), default=8080)
    p.add_argument("--max-rows", type=cli_type(PositiveInt), default=MAX_ROWS,
                   help=f"rows per request (default {MAX_ROWS})")
    p.add_argument("--max-body-bytes", type=cli_type(PositiveInt), default=MAX_BODY_BYTES,
                   help=f"request body size limit (default {MAX_BODY_BYTES})")
    p.add_argument("--batch-wait-ms", type=cli_type(NonNegativeFloat), default=MAX_BATCH_WAIT_MS,
                   help="under concurrent load, how long a micro-batch waits for more requests (default "
                        f"{MAX_BATCH_WAIT_MS}; a request that finds the server idle never waits)")
    p.add_argument("--max-batch-rows", type=cli_type(PositiveInt), default=MAX_BATCH_ROWS,
                   help=f"a micro-batch closes at this many rows (default {MAX_BATCH_ROWS})")
    p.add_argument("--threads", type=cli_type(PositiveInt), default=None,
                   help="torch intra-op threads for scoring, per worker (default: CPU cores - 1 for one worker, "
                        "cores / workers for several, at least 1)")
    p.add_argument("--workers", type=cli_type(PositiveInt), default=1,
                   help="server processes sharing the port, each with its own copy of the model (default 1; "
                        "about one per core scales rows/s with the cores)")
    p.add_argument("--watch", metavar="DIR", default=None,
                   help="hot reload: serve the newest checkpoint (*.pt) written to DIR, swapped in atomically "
                        "by every worker; a checkpoint failing its checksum or changing the input fields is "
                        "refused (logged) and the live model keeps serving; /metadata's 'live' names it")
    p.add_argument("--watch-interval", type=cli_type(PositiveFloat), default=WATCH_INTERVAL_S,
                   help=f"seconds between two looks at --watch DIR (default {WATCH_INTERVAL_S})")
    p.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")
