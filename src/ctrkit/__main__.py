"""``python -m ctrkit``: the ``ctrkit`` command line."""

from ctrkit.cli import run

run()
