"""A point carries its metric's unit as the registry (core/metrics.py) declares it.

The OTLP encoder writes the registry's unit, so a point whose own unit differs changes on the
wire: a jobs tier that decodes a node agent's gpu.ofu (unit {ratio}) got points unlike the
ones the node made (unit 1), and every comparison of the two roads (exactness, replay, the
fleet's intake) disagreed. One unit per metric name, whoever makes the point.
"""

from __future__ import annotations

from collections import Counter

import yaml

from otel_ofu.core.metrics import METRICS
from otel_ofu.pipeline import registry
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.processors.jobs import JobsProcessor
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.sim import SimReceiverConfig, build_fleet, window_batch
from tests.test_jobs_processor import DEMO

START = 1_800_000_000.0


def demo_points(windows: int = 40) -> list:
    doc = yaml.safe_load(DEMO.read_text())
    sim = build_config(SimReceiverConfig, {**doc["receivers"]["sim"], "emit_truth": True})
    fleet = build_fleet(sim, START)
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    jobs = JobsProcessor(build_config(registry.factories()["processors"]["jobs"].config_type,
                                      doc["processors"]["jobs"]), Context("jobs"), clock=lambda: START + fleet.t)
    points = []
    for _ in range(windows):
        points += jobs.process(ofu.process(window_batch(fleet.step_window(), True))).points
    return points + jobs.flush().points


def test_every_point_of_the_demo_pipeline_carries_its_registered_unit():
    points = demo_points()
    names = Counter(p.name for p in points)
    # The pipeline made what is checked: OFU, its inputs, the loss account and the jobs' metrics.
    assert {"gpu.ofu", "gpu.ofu.raw", "gpu.tensor.activity", "gpu.graphics_engine.activity", "gpu.ofu.loss",
            "job.ofu", "training.mfu"} <= set(names)
    wrong = Counter((p.name, p.unit, METRICS[p.name].unit) for p in points
                    if p.name in METRICS and p.unit != METRICS[p.name].unit)
    assert not wrong, wrong
