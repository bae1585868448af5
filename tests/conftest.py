import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

from tests.e2e_util import Process, collector_binary  # noqa: E402


@pytest.fixture(scope="module")
def otelcol() -> str:
    """The otelcol-ofu Collector binary (built once and cached; skipped or failed when unavailable)."""
    return collector_binary()


@pytest.fixture
def processes():
    """Processes a test starts (append them); stopped, newest first, when it ends."""
    started: list[Process] = []
    yield started
    for proc in reversed(started):
        proc.stop()
