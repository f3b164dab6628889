"""The one exception the CLI shows to users: a problem explained in one sentence."""

from __future__ import annotations

EXIT_USAGE = 2
"""Exit status for bad input (as argparse uses)."""


class CliError(Exception):
    """A problem with the user's input or environment, explained in one sentence."""
