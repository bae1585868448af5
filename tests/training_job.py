"""A stand-in training process for the end-to-end tests: what a job's rank runs, minus the model.

It uses otel_ofu.training exactly as training code does (the real OpenTelemetry SDK, OTLP over
the network); its identity comes from the environment the test gives it (downward API
variables, SLURM_JOB_ID). Runs until SIGTERM, then exports its last values and exits 0.

    python -m tests.training_job --endpoint http://127.0.0.1:4317 --mfu 0.52
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import threading

from otel_ofu.training import start_mfu_reporter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--protocol", default="grpc")
    parser.add_argument("--mfu", type=float)
    parser.add_argument("--tflops-per-gpu", type=float)
    parser.add_argument("--export-interval", type=float, default=1.0)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--every-n-steps", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    stop = threading.Event()

    def on_sigterm(*_: object) -> None:
        stop.set()
        # Still running 20 s later (the test kills it at 30 s): every thread's stack into the log, so
        # what held the shutdown is in the test's failure output.
        faulthandler.dump_traceback_later(20, exit=False)

    signal.signal(signal.SIGTERM, on_sigterm)
    reporter = start_mfu_reporter(endpoint=args.endpoint, protocol=args.protocol, every_n_steps=args.every_n_steps,
                                  export_interval_s=args.export_interval)
    logging.info("reporting as %s", dict(reporter.resource.attributes))
    step = 0
    while not stop.wait(args.step_time):  # one "training step"
        step += 1
        reporter.report(step, mfu=args.mfu, tflops_per_gpu=args.tflops_per_gpu)
    reporter.shutdown()


if __name__ == "__main__":
    main()
