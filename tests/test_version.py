"""One version everywhere: the package, ``otel-ofu --version``, the Helm chart, the notes that name one."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import yaml

from otel_ofu import __version__
from tests.e2e_util import ROOT

CHART = ROOT / "deploy" / "helm" / "otel-ofu" / "Chart.yaml"


def release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_pyproject_takes_the_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"], "write the version once, in otel_ofu/__init__.py"
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "otel_ofu.__version__"}


def test_the_cli_says_the_package_version() -> None:
    done = subprocess.run([sys.executable, "-m", "otel_ofu", "--version"], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == f"otel-ofu {__version__}"


def test_the_chart_version_and_app_version_are_the_package_version() -> None:
    chart = yaml.safe_load(CHART.read_text())
    assert chart["appVersion"] == __version__, "the image tag the chart defaults to is the appVersion"
    assert chart["version"] == __version__


def test_no_note_names_a_version_newer_than_this_one() -> None:
    """A "Changed in 0.2" note under version 0.1.0 says the version was not raised."""
    notes = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        notes += [(path.name, found) for found in re.findall(r"(?:Changed|New|Added|Removed) in (\d+\.\d+)",
                                                             path.read_text())]
    assert notes, "the README's 'Changed in' note is gone: update this test"
    for name, version in notes:
        assert release(version) <= release(__version__)[:2], f"{name}: 'in {version}' but the version is {__version__}"
