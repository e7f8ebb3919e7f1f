"""The command line's one kind of user error: bad input is one line on stderr and exit code 2, before anything is
written (no traceback, and once per job under torchrun)."""

import os
import sys


class CliError(Exception):
    """Bad input: printed as one line, exit code 2, nothing written."""


class SilentError(CliError):
    """An error rank 0 has already reported: this rank exits with the same code and says nothing."""


def report(error: CliError) -> None:
    """The one-line error, once per job (by rank 0)."""
    if not isinstance(error, SilentError) and int(os.environ.get("RANK", "0")) == 0:
        print(f"stable-models: error: {error}", file=sys.stderr)
