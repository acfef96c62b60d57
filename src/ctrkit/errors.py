"""The root of ctrkit's own error types. The CLI prints these as one line (no traceback) and exits 2.

Each error message names what is wrong (file, row, feature, option) and how to fix it.
"""


class CtrkitError(Exception):
    """Base class of every error ctrkit raises on purpose."""
