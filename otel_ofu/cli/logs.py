"""Logging for the command line: one format, to stderr, at the level a command asks for."""

from __future__ import annotations

import logging
import sys


def configure_logging(level: str) -> None:
    """``level`` as the CLI and configs spell it: debug, info, warn/warning, error."""
    name = level.upper()
    name = "WARNING" if name == "WARN" else name
    logging.basicConfig(level=getattr(logging, name), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
