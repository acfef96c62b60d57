"""The options of ``ctrkit serve`` and their defaults, apart from :mod:`ctrkit.serving.server` so that the command
line can list them without importing FastAPI (an optional dependency: ``pip install 'ctrkit[serve]'``)."""

from __future__ import annotations

import argparse
import os

from ctrkit.typecheck import NonNegativeFloat, Port, PositiveInt, cli_type

MAX_ROWS = 4096  # rows per request
MAX_BODY_BYTES = 8 << 20  # about 13,000 Criteo rows of raw JSON; parsing that takes ~0.1 s
MAX_BATCH_WAIT_MS = 2.0
MAX_BATCH_ROWS = 4096
MAX_ERRORS = 1000  # (row, field) errors listed in one response


def default_threads() -> int:
    """Intra-op threads for the model: all cores but one, which the event loop (HTTP, JSON) needs."""
    return max(1, (os.cpu_count() or 2) - 1)


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="checkpoint to serve (e.g. runs/<name>/best.pt)")
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
                   help="torch intra-op threads for scoring (default: CPU cores - 1, at least 1)")
    p.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")
