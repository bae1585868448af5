#!/usr/bin/env bash
# The hardware run (issue 9): OFU against measured MFU on one NVIDIA GPU, in one command that
# ends itself within DEVICE_BUDGET_S (default 420 s) and keeps what it has. Steps: otel-ofu
# doctor --json; benchmarks/gpu_check.py (bf16 8192^3, 60 s, 5 s windows); benchmarks/
# gemm_validation.py --quick --json (bf16, fp16, tf32, fp8; aligned and ragged shapes); the
# report (benchmarks/device_report.py). Output in $OUT (else ./device-out): device_run.json,
# device_run.log, doctor.json, gpu_check.json, gemm_validation.json, report.md.
# benchmarks/device_run.py holds the logic and says what each status means.
#
# On the project's GPU machine (the device tool; no network there, so the dependencies travel
# as wheels):
#   1. here, with network:   benchmarks/device_wheels.sh        # -> benchmarks/.wheels (~11 MB, ignored)
#   2. the device tool call: run(command="benchmarks/device_run.sh",
#                                carry=["benchmarks/.wheels"], timeout_s=480)
#   3. here, on what came back:  .venv/bin/python benchmarks/device_report.py <files_at>
#   A second try of one step, if time is left:
#      run(command="DEVICE_STEPS=gemm_validation,report DEVICE_BUDGET_S=240 benchmarks/device_run.sh",
#          carry=["benchmarks/.wheels"], timeout_s=300)
#
# Without a GPU (CI, a laptop) every step reports "no GPU" and the exit status is 0. With
# OTEL_OFU_PYTHON set (CI: .venv/bin/python) the steps run on that Python, in their no-GPU
# modes, without any wheels; without it and without wheels they are skipped.
#   OTEL_OFU_PYTHON=.venv/bin/python benchmarks/device_run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export DEVICE_RUN_COMMAND="${DEVICE_RUN_COMMAND:-benchmarks/device_run.sh${*:+ $*}}"
exec "${DEVICE_RUN_PYTHON:-python3}" "$here/device_run.py" "$@"
