import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

from tests.e2e_util import Process, collector_binary  # noqa: E402

# The seed of this run's property and fuzz tests (tests/test_fuzz.py): new each run, so the runs
# together try many inputs; OTEL_OFU_FUZZ_SEED=N repeats a run's.
FUZZ_SEED = int(os.environ.get("OTEL_OFU_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
os.environ["OTEL_OFU_FUZZ_SEED"] = str(FUZZ_SEED)  # the same seed for any later import of this module


def pytest_report_header(config):
    return f"fuzz seed: {FUZZ_SEED} (repeat with OTEL_OFU_FUZZ_SEED={FUZZ_SEED})"


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
