"""Log lines above the live console instead of through it.

A live display redraws its region in place; a log record written straight to the same
terminal lands inside that region and is overdrawn at the next refresh. While a live
console runs, :func:`route_logging` swaps the root logger's terminal handlers for a
``RichHandler`` printing through the console's own ``Console``, which rich prints above the
live region; on exit the previous handlers come back. Handlers writing elsewhere (files,
a redirected stderr) are left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.highlighter import NullHighlighter
from rich.logging import RichHandler


def _writes_to_terminal(handler: logging.Handler) -> bool:
    if isinstance(handler, logging.FileHandler) or not isinstance(handler, logging.StreamHandler):
        return False
    isatty = getattr(handler.stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def rich_handler(console: Console) -> RichHandler:
    """Log records as lines printed through ``console``: time, level, logger: message."""
    handler = RichHandler(console=console, show_path=False, markup=False, rich_tracebacks=False,
                          log_time_format="%H:%M:%S", omit_repeated_times=False,
                          highlighter=NullHighlighter())  # colour for meaning only: the level, not every number
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    return handler


@contextmanager
def route_logging(console: Console | None) -> Iterator[bool]:
    """While inside, root-logger records that went to the terminal print through ``console``.

    Yields whether anything was rerouted (nothing when ``console`` is None or no handler
    writes to a terminal).
    """
    root = logging.getLogger()
    replaced = [h for h in root.handlers if _writes_to_terminal(h)] if console is not None else []
    if not replaced:
        yield False
        return
    handler = rich_handler(console)
    handler.setLevel(min(h.level for h in replaced))
    for old in replaced:
        root.removeHandler(old)
    root.addHandler(handler)
    try:
        yield True
    finally:
        root.removeHandler(handler)
        for old in replaced:
            root.addHandler(old)
