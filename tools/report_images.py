"""Regenerate the report pictures in docs/img: ``python -m tools.report_images``.

Runs the demo (collector-config/demo.yaml) for an hour of fleet time, sped up, into its file
exporter's recording (tools.demo_prometheus.run_demo), then ``otel-ofu report --plots`` on it,
and keeps four of the plots: the MoE job's timeline (its reported MFU far above its OFU: the
MFU audit's finding), the regressed job's timeline, the fleet's OFU distribution and the loss
breakdown (each job's GPU-hours by part of the loss account, and the fleet's).
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
from pathlib import Path

from otel_ofu.cli.main import main as otel_ofu
from tools.demo_prometheus import run_demo

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "img"
KEEP = {"job-moe-236b.png": "report-job-moe.png", "job-sft-debug-flag.png": "report-job-regression.png",
        "fleet-ofu-distribution.png": "report-fleet.png", "loss-breakdown.png": "report-loss-breakdown.png"}

log = logging.getLogger("tools.report_images")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run_demo(work, span_s=3600.0, acceleration=600.0)
        plots = work / "plots"
        if otel_ofu(["report", str(work / "demo.jsonl"), "--plots", str(plots)]) != 0:
            return 1
        made = {p.name for p in plots.glob("*.png")}
        for source, target in KEEP.items():
            if source not in made:
                log.error("the report made no %s (it made: %s)", source, ", ".join(sorted(made)))
                return 1
            shutil.copyfile(plots / source, IMAGES / target)
            log.info("wrote %s", IMAGES / target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
