"""``python -m ctrkit``: the ``ctrkit`` command line."""

import sys

from ctrkit.cli import main

sys.exit(main())
