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


# The whole suite (plain `pytest`, as .ci/run runs it) on this many processes (pytest-xdist; `-n auto`
# in pyproject.toml's addopts): many tests wait on servers (the Collector, Prometheus, kube-apiserver,
# the console in tmux), so 3 processes on a CI machine's 2 cores run it in half the time; more only add
# contention, the cores being busy by then (docs/DEVELOPING.md, "CI time"). PYTEST_XDIST_AUTO_NUM_WORKERS=N
# or `-n N` choose another number, `-n 0` one process.
TEST_WORKERS = 3


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: TEST_WORKERS for the whole suite; named files or tests (`pytest tests/test_x.py`) run
    in this one process, as a quick loop wants (no workers to start; --pdb and -s work as usual)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    return TEST_WORKERS if config.args_source is pytest.Config.ArgsSource.TESTPATHS else 0


# Test files that take minutes (report computations over an hour's recording, the demo into every
# backend, the robustness benchmarks): the parallel suite starts them first (`--dist loadfile` hands
# out files in collection order, `--no-loadscope-reorder`), so no process starts one while the others
# run out of work. Only the order changes; a file missing here is only started later.
LONG_FILES = ("test_report.py", "test_report_inputs.py", "test_backends.py", "test_dashboards_prometheus.py",
              "test_robustness_benchmarks.py", "test_exporter_file.py", "test_otlp_scrape_shapes.py",
              "test_console_terminal.py", "test_readme.py")


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # a pytest-xdist worker; one process keeps the files' order
        first = {name: i for i, name in enumerate(LONG_FILES)}
        items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: a file's own order kept


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
