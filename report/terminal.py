"""The one way commands print to the terminal (rich), so that tables read the same everywhere."""

from __future__ import annotations

import sys

#: Columns when output is piped (CI logs, `| tee`): rich would otherwise fold wide tables into 80 columns.
PIPED_WIDTH = 200


def console(*, stderr: bool = False):
    """A rich Console on stdout (or stderr): the terminal's width, or PIPED_WIDTH columns when not a terminal."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr) if stream.isatty() else Console(stderr=stderr, width=PIPED_WIDTH)
