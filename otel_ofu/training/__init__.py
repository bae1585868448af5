"""Report a training job's MFU (or achieved TFLOP/s per GPU) to otel-ofu, from the training code.

One call sets up an OpenTelemetry meter whose resource names the process the way otel-ofu's
``attribution`` processor maps to a job (pod, Slurm job, host and pid), and exports over OTLP::

    from otel_ofu.training import start_mfu_reporter

    reporter = start_mfu_reporter(every_n_steps=10)
    for step in range(steps):
        ...
        reporter.report(step, mfu=mfu)  # or tflops_per_gpu=...

Framework-free: it imports the OpenTelemetry SDK and the standard library only.
docs/audit.md has the recipes for PyTorch Lightning, Hugging Face, torchtitan and Megatron-LM.
"""

from otel_ofu.training.report import MfuReporter, start_mfu_reporter, training_resource

__all__ = ["MfuReporter", "start_mfu_reporter", "training_resource"]
