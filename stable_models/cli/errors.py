"""The command line's one kind of user error: bad input is one line on stderr and exit code 2, before anything is
written (no traceback, and once per job under torchrun)."""

import os
import sys
import traceback


class CliError(Exception):
    """Bad input: printed as one line, exit code 2, nothing written."""


class SilentError(CliError):
    """An error rank 0 has already reported: this rank exits with the same code and says nothing."""


def report(error: CliError, verbose: bool = False) -> None:
    """The one-line error, once per job (by rank 0); with --verbose, above it the traceback of the exception it
    replaced (the reader's or the loader's own), where there was one."""
    if not isinstance(error, SilentError) and int(os.environ.get("RANK", "0")) == 0:
        underneath = error.__cause__ or error.__context__
        if verbose and underneath is not None:
            traceback.print_exception(underneath, file=sys.stderr)
        print(f"stable-models: error: {error}", file=sys.stderr)
