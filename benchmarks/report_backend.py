"""The report from the backend at fleet scale: ``otel-ofu report --prometheus`` over a month of 10,000 GPUs.

Why: an operator at scale keeps the jobs processor's series in Prometheus or VictoriaMetrics, not
recordings (issue 33). The report from the backend must stay a handful of queries whose work is
the TSDB's: this measures its wall time and its own CPU against the TSDB's.

The fleet's job series are generated directly, as the jobs processor would export them through
any road with Prometheus naming: per job its counters (``job_gpu_seconds_total``,
``job_wasted_gpu_hours_total``, ``job_ofu_loss_gpu_hours_total`` per loss part, ``job_flops_total``),
its gauges (``job_gpus``, ``job_ofu`` per window, ``job_ofu_loss`` over life with causes,
``job_finding`` for the jobs with a finding) and the fleet's ``fleet_gpu_hours_total`` by part.
The jobs processor emits every resolution bin (1 m); here every ``--step`` (5 m by default: a
fifth of the samples, the same queries). Jobs of 8 to 512 GPUs (whole 8-GPU nodes) run 1 h to 7
days, one after another on their nodes with idle gaps, over ``--days`` ending an hour ago. The
series go into a fresh VictoriaMetrics (collector/build-victoriametrics.sh, $VICTORIAMETRICS)
with its JSON-lines import API (``/api/v1/import``), then ``otel-ofu report --prometheus URL
--start -Nd --json`` runs as a child process, timed: wall, its own CPU (user+system of the child)
and VictoriaMetrics' CPU in the same interval (/proc/PID/stat). VictoriaMetrics runs without its
query cache (``-search.disableCache``): every answer is computed.

    python benchmarks/report_backend.py --json                     # 10,000 GPUs, 30 days
    python benchmarks/report_backend.py --gpus 64 --days 1 --json  # the smoke test's
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.backends import VictoriaMetrics  # noqa: E402

PARTS = ("engine_idle", "sm_idle", "non_tensor", "clock", "padding")
CAUSES = {"clock": "hw_thermal", "non_tensor": "not_memory_bound"}
SIZES = (8, 16, 32, 64, 128, 256, 512)
SIZE_WEIGHTS = (20, 20, 18, 15, 12, 10, 5)
PEAK_FLOPS = 989e12  # H100 SXM dense BF16
BATCH_BYTES = 32 * 1024 * 1024


def victoriametrics_binary() -> str:
    found = os.environ.get("VICTORIAMETRICS")
    if found:
        return found
    done = subprocess.run([str(ROOT / "collector" / "build-victoriametrics.sh")], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"VictoriaMetrics unavailable: run collector/build-victoriametrics.sh or set "
                         f"VICTORIAMETRICS\n{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def schedule(gpus: int, start: float, end: float, rng: random.Random) -> list[tuple[str, int, float, float]]:
    """Jobs (id, GPUs, start, end) packed onto 8-GPU nodes over [start, end]: each job takes the nodes free
    soonest, after an idle gap."""
    nodes = [start + rng.uniform(0, 3600) for _ in range(max(1, gpus // 8))]
    jobs = []
    while min(nodes) < end:
        size = min(rng.choices(SIZES, SIZE_WEIGHTS)[0], 8 * len(nodes))
        order = sorted(range(len(nodes)), key=nodes.__getitem__)[: size // 8]
        begin = max(nodes[i] for i in order) + rng.uniform(0, 1800)
        length = min(7 * 86400.0, max(3600.0, rng.lognormvariate(math.log(12 * 3600), 1.0)))
        for i in order:
            nodes[i] = begin + length
        if begin < end:
            jobs.append((f"job-{len(jobs):05d}", size, begin, min(begin + length, end)))
    return jobs


def job_series(job: tuple[str, int, float, float], step: float, rng: random.Random,
               fleet: dict[str, dict[int, float]]) -> list[dict]:
    """One job's series as /api/v1/import lines; adds its GPU hours per part to ``fleet`` (by step)."""
    job_id, size, begin, finish = job
    first = math.ceil(begin / step)
    steps = list(range(first, int(finish // step) + 1))
    if len(steps) < 2:
        return []
    stamps = [int(k * step * 1000) for k in steps]
    base = rng.uniform(0.12, 0.6)
    weights = [rng.uniform(0.2, 1.0) for _ in PARTS]
    total_w = sum(weights)
    labels = {"ofu_job_id": job_id, "k8s_namespace_name": f"team-{int(job_id[4:]) % 7}", "cluster": "bench"}
    gpu_s = wasted = flops = 0.0
    lost = dict.fromkeys(PARTS, 0.0)
    cum: dict[str, list[float]] = {k: [] for k in ("gpu_s", "wasted", "flops", *PARTS)}
    ofu_values, life_values = [], []
    life_num = 0.0
    for k in steps:
        ofu = min(0.95, max(0.01, base + rng.gauss(0, 0.03)))
        seconds = size * step
        gpu_s += seconds
        wasted += seconds * (1 - ofu) / 3600.0
        flops += seconds * ofu * PEAK_FLOPS
        for part, w in zip(PARTS, weights):
            lost[part] += seconds * (1 - ofu) * w / total_w / 3600.0
            fleet[part][k] = fleet[part].get(k, 0.0) + seconds * (1 - ofu) * w / total_w / 3600.0
        fleet["useful"][k] = fleet["useful"].get(k, 0.0) + seconds * ofu / 3600.0
        fleet["_busy"][k] = fleet["_busy"].get(k, 0.0) + size
        life_num += ofu * seconds
        cum["gpu_s"].append(gpu_s)
        cum["wasted"].append(wasted)
        cum["flops"].append(flops)
        for part in PARTS:
            cum[part].append(lost[part])
        ofu_values.append(ofu)
        life_values.append(life_num / gpu_s)

    def line(name: str, values: list[float], **extra: str) -> dict:
        return {"metric": {"__name__": name, **labels, **extra}, "values": [round(v, 6) for v in values],
                "timestamps": stamps}

    out = [line("job_gpu_seconds_total", cum["gpu_s"]), line("job_wasted_gpu_hours_total", cum["wasted"]),
           line("job_flops_total", cum["flops"]), line("job_gpus", [float(size)] * len(steps)),
           line("job_ofu", ofu_values, ofu_window="5m"), line("job_ofu", ofu_values, ofu_window="1h"),
           line("job_ofu", life_values, ofu_window="life")]
    out += [line("job_ofu_loss_gpu_hours_total", cum[part], ofu_loss_part=part) for part in PARTS]
    out += [line("job_ofu_loss", [w / total_w * (1 - v) for v in life_values], ofu_window="life", ofu_loss_part=part,
                 ofu_loss_cause=CAUSES[part]) for part, w in zip(PARTS, weights) if part in CAUSES]
    if rng.random() < 0.05 and len(steps) > 20:  # a regression, open for a while then cleared
        a = rng.randrange(5, len(steps) // 2)
        b = min(len(steps) - 1, a + rng.randrange(3, 40))
        out.append({"metric": {"__name__": "job_finding", **labels, "ofu_finding_kind": "regression",
                               "ofu_finding_cause": "sustained_ofu_drop"},
                    "values": [1.0] * (b - a) + [0.0], "timestamps": stamps[a:b + 1]})
    return out


def fleet_series(fleet: dict[str, dict[int, float]], gpus: int, step: float) -> list[dict]:
    """fleet_gpu_hours_total by part, the idle GPUs' time as ``unallocated``."""
    steps = sorted(fleet["_busy"])
    out = []
    for part in ("useful", *PARTS, "unallocated"):
        total, values = 0.0, []
        for k in steps:
            total += ((gpus - fleet["_busy"][k]) * step / 3600.0 if part == "unallocated"
                      else fleet[part].get(k, 0.0))
            values.append(round(total, 6))
        out.append({"metric": {"__name__": "fleet_gpu_hours_total", "ofu_loss_part": part, "cluster": "bench",
                               "service_instance_id": "jobs-0"},
                    "values": values, "timestamps": [int(k * step * 1000) for k in steps]})
    return out


def post(url: str, body: bytes) -> None:
    request = urllib.request.Request(f"{url}/api/v1/import", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=600) as response:
        response.read()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--step", type=float, default=300.0, help="seconds between a job's samples (default 300)")
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--json", action="store_true", help="print one JSON line with the results")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    end = math.floor((time.time() - 3600.0) / args.step) * args.step
    start = end - args.days * 86400.0
    with tempfile.TemporaryDirectory(prefix="report-backend-") as tmp:
        vm = VictoriaMetrics(victoriametrics_binary(), Path(tmp) / "vm", flags=()).start()
        try:
            began = time.monotonic()
            jobs = schedule(args.gpus, start, end, rng)
            fleet: dict[str, dict[int, float]] = {part: {} for part in ("useful", *PARTS, "_busy")}
            series = samples = 0
            generated_gpu_h: dict[str, float] = {}
            chunk: list[bytes] = []
            size = 0
            for job in jobs:
                lines = job_series(job, args.step, rng, fleet)
                if lines:
                    generated_gpu_h[job[0]] = lines[0]["values"][-1] / 3600.0
                for item in lines:
                    data = json.dumps(item, separators=(",", ":")).encode() + b"\n"
                    chunk.append(data)
                    size += len(data)
                    series += 1
                    samples += len(item["values"])
                if size > BATCH_BYTES:
                    post(vm.url, b"".join(chunk))
                    chunk, size = [], 0
            for item in fleet_series(fleet, args.gpus, args.step):
                chunk.append(json.dumps(item, separators=(",", ":")).encode() + b"\n")
                series += 1
                samples += len(item["values"])
            post(vm.url, b"".join(chunk))
            vm.flush()
            import_s = time.monotonic() - began

            assert vm.process is not None
            tsdb_before = cpu_seconds(vm.process.pid)
            own_before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "otel_ofu", "report", "--prometheus", vm.url, "--start", f"{start:.0f}",
                 "--end", f"{end:.0f}", "--json"], capture_output=True, text=True, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)})
            wall = time.monotonic() - t0
            own_after = resource.getrusage(resource.RUSAGE_CHILDREN)
            tsdb_cpu = cpu_seconds(vm.process.pid) - tsdb_before
            if done.returncode != 0:
                raise SystemExit(f"report --prometheus failed:\n{done.stderr[-3000:]}")
            report = json.loads(done.stdout)
        finally:
            vm.stop()
    own_cpu = (own_after.ru_utime - own_before.ru_utime) + (own_after.ru_stime - own_before.ru_stime)
    reported = {j["job_id"]: j["gpu_hours"] for j in report["jobs"]}
    worst = max((abs(reported.get(j, 0.0) / h - 1) for j, h in generated_gpu_h.items()), default=0.0)
    result = {
        "gpus": args.gpus, "days": args.days, "step_s": args.step, "jobs": len(generated_gpu_h),
        "series": series, "samples": samples, "import_s": round(import_s, 1),
        "queries": report["lines"], "report_wall_s": round(wall, 2), "report_cpu_s": round(own_cpu, 2),
        "tsdb_cpu_s": round(tsdb_cpu, 2), "tsdb_cpu_share": round(tsdb_cpu / (tsdb_cpu + own_cpu), 3),
        "jobs_reported": len(report["jobs"]), "fleet_gpu_hours": round(report["fleet"]["gpu_hours"], 1),
        "worst_job_gpu_hours_error": round(worst, 5), "cores": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")


if __name__ == "__main__":
    main()
