"""The hardware run of issue 9, in one command: what ``benchmarks/device_run.sh`` executes.

Why a Python driver: each step needs its own time limit inside one global budget, a step that
runs out of time must leave its partial output, and every step's result must land as JSON
(stdlib only, so it runs before otel-ofu is installed). See device_run.sh for the call.

Steps, in order, each writing ``$OUT/<step>.json`` (its own JSON, or a stub saying why none):

1. ``doctor``: ``otel-ofu doctor --json`` (what NVML and GPM report);
2. ``gpu_check``: ``benchmarks/gpu_check.py --json``, bf16 8192^3 for 60 s, 5 s windows;
3. ``gemm_validation``: ``benchmarks/gemm_validation.py --quick --json`` over bf16, fp16,
   tf32 and fp8, two aligned and two ragged shapes each;
4. ``report``: ``benchmarks/device_report.py`` on the folder, into ``report.md``.

``device_run.json`` records the environment, the GPU detection and each step's status
(ok | no-gpu | failed | timeout | skipped), rewritten after every step; ``device_run.log``
holds everything the steps wrote to stderr. Six files, within what the device tool returns
(8 files).

Environment: the steps run on ``$OTEL_OFU_PYTHON`` when set (CI: the project's venv);
otherwise, when the wheels folder (``benchmarks/.wheels``, made by device_wheels.sh) holds
wheels, they are installed with ``pip --no-index --no-deps --target`` into a fresh folder
put on PYTHONPATH after the working tree (the working tree's otel_ofu is the code that runs;
the wheels bring its dependencies). No venv: on the GPU machine ``python3`` is itself a venv
(/opt/torch/.venv), and a venv made from it with --system-site-packages would not see its
torch.

Without a GPU (torch missing or no CUDA device) each step runs in its no-GPU mode when an
environment exists (doctor reports no source, gpu_check says "no GPU", gemm_validation does
its dry run), or is skipped when none does; every step's status is "no-gpu", its message
says why, and the exit status is 0. With a GPU the exit status is 0 when every step is ok,
1 when one failed, timed out or was skipped for time, 2 when otel-ofu could not be set up.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
DEFAULT_WHEELS = BENCHMARKS / ".wheels"
DEFAULT_SITE = Path("/tmp/otel-ofu-device-site")
DEFAULT_BUDGET_S = 420.0  # the device call's timeout_s is 480: the run ends itself a minute before
GRACE_S = 20.0  # after SIGTERM a step reports what it has; then SIGKILL
RESERVE_S = 25.0  # kept for the report step and the last write
SOURCE_FILE = "SOURCE.json"  # what device_wheels.sh built the wheels from

log = logging.getLogger("device_run")

DETECT = r"""
import json
out = {"torch": None, "cuda": False}
try:
    import torch
except Exception as exc:
    out["reason"] = "torch is not installed"
    out["import_error"] = f"{type(exc).__name__}: {exc}"
else:
    out["torch"] = str(torch.__version__)
    out["cuda_version"] = str(torch.version.cuda)
    try:
        ok = bool(torch.cuda.is_available())
    except Exception as exc:
        ok, out["reason"] = False, f"torch.cuda.is_available() failed: {type(exc).__name__}: {exc}"
    if ok:
        out.update(cuda=True, device_count=torch.cuda.device_count(), name=torch.cuda.get_device_name(0),
                   capability=list(torch.cuda.get_device_capability(0)))
    else:
        out.setdefault("reason", "no CUDA GPU visible to torch")
print(json.dumps(out))
"""

REQUIREMENTS_CHECK = r"""
import importlib.metadata as md, json
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
unmet = []
for text in md.requires("otel-ofu") or []:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        unmet.append(f"{req}: not installed")
        continue
    if not req.specifier.contains(version, prereleases=True):
        unmet.append(f"{req}: {version} installed")
print(json.dumps(unmet))
"""


@dataclass
class Step:
    name: str
    argv: list[str]
    output: str  # file under the output folder
    timeout_s: float  # the most this step may take
    minimum_s: float  # skipped when less time than this is left
    status: str = "pending"  # ok | no-gpu | failed | timeout | skipped
    message: str = ""
    rc: int | None = None
    seconds: float = 0.0
    limit_s: float = 0.0  # the limit it ran under
    asked: bool = True  # False: left out by DEVICE_STEPS
    command: str = ""  # as run, placeholders filled in


@dataclass
class Run:
    out: Path
    budget_s: float
    started: float = field(default_factory=time.monotonic)
    record: dict[str, Any] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)

    def remaining(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def save(self) -> None:
        """device_run.json, rewritten after each step so a run cut short keeps what it had."""
        self.record["elapsed_s"] = round(time.monotonic() - self.started, 1)
        self.record["steps"] = [{k: v for k, v in asdict(s).items() if k not in ("timeout_s", "minimum_s", "argv")}
                                for s in self.steps]
        tmp = self.out / "device_run.json.tmp"
        tmp.write_text(json.dumps(self.record, indent=2) + "\n")
        tmp.replace(self.out / "device_run.json")


def source_digest(repo: Path = REPO) -> str:
    """sha256 over otel_ofu's sources and pyproject.toml: says whether a carried wheel is this code."""
    digest = hashlib.sha256()
    for path in sorted([*(repo / "otel_ofu").rglob("*.py"), repo / "pyproject.toml"]):
        digest.update(path.relative_to(repo).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def write_manifest(folder: Path, python_version: str) -> None:
    """SOURCE.json in the wheels folder (device_wheels.sh calls this)."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    (folder / SOURCE_FILE).write_text(json.dumps({
        "source_sha256": source_digest(), "commit": commit.strip() or None, "python_version": python_version,
        "built_utc": _utc_now(), "wheels": sorted(p.name for p in folder.glob("*.whl"))}, indent=2) + "\n")


def _utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _tail(path: Path, limit: int = 1500) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode(errors="replace")


def run_quiet(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str] | str:
    """A helper command (detection, pip): its result, or why it did not finish."""
    try:
        return subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"did not finish within {timeout:.0f} s"
    except OSError as exc:
        return f"could not start: {exc}"


def install_wheels(python: str, wheels: Path, site: Path, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """The carried wheels into ``site`` (offline); what was installed, whether the pins hold, the code's match."""
    info: dict[str, Any] = {"wheels": str(wheels), "site": str(site)}
    files = sorted(wheels.glob("*.whl"))
    info["count"] = len(files)
    shutil.rmtree(site, ignore_errors=True)
    result = run_quiet([python, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
                        "--disable-pip-version-check", "--upgrade", "--target", str(site), *map(str, files)],
                       env, timeout)
    if isinstance(result, str) or result.returncode != 0:
        detail = result if isinstance(result, str) else (result.stderr or result.stdout)[-2000:]
        log.error("pip install from %s failed: %s", wheels, detail)
        info["error"] = f"pip install --no-index from {wheels} failed: {detail}"
        return info
    check_env = {**env, "PYTHONPATH": str(site)}
    check = run_quiet([python, "-c", REQUIREMENTS_CHECK], check_env, 60)
    if isinstance(check, str) or check.returncode != 0:
        info["unmet_requirements"] = [f"could not check: {check if isinstance(check, str) else check.stderr[-500:]}"]
    else:
        info["unmet_requirements"] = json.loads(check.stdout)
    for line in info["unmet_requirements"]:
        log.warning("requirement not met after install: %s", line)
    try:
        source = json.loads((wheels / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        source = {}
    info["built_from"] = source.get("commit")
    info["wheel_matches_tree"] = source.get("source_sha256") == source_digest()
    if not info["wheel_matches_tree"]:
        log.warning("the carried otel-ofu wheel was built from other code than this working tree: the working "
                    "tree's otel_ofu runs (it comes first on PYTHONPATH); rerun benchmarks/device_wheels.sh if "
                    "pyproject.toml's dependencies changed")
    return info


def run_step(run: Run, step: Step, env: dict[str, str], log_path: Path) -> None:
    """One step under its limit: stdout to its file, stderr to the log; SIGTERM, then SIGKILL, on time out."""
    limit = min(step.timeout_s, run.remaining() - RESERVE_S - GRACE_S)
    if step.name == "report":
        limit = min(step.timeout_s, run.remaining())
    if limit < step.minimum_s:
        step.status = "skipped"
        step.message = f"time budget: {max(run.remaining(), 0):.0f} s left, this step needs {step.minimum_s:.0f} s"
        return
    argv = [_fit_to_limit(arg, limit) for arg in step.argv]
    step.limit_s = round(limit, 1)
    step.command = " ".join(argv)
    output = run.out / step.output
    log.info("step %s (limit %.0f s): %s", step.name, limit, " ".join(argv))
    for handler in log.handlers:
        handler.flush()
    t0 = time.monotonic()
    with open(output, "wb") as stdout, open(log_path, "ab") as stderr:
        stderr.write(f"\n----- {step.name}: {' '.join(argv)}\n".encode())
        stderr.flush()
        proc = subprocess.Popen(argv, stdout=stdout, stderr=stderr, cwd=REPO, env=env, start_new_session=True)
        timed_out = False
        try:
            step.rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            log.warning("step %s: over its %.0f s limit: SIGTERM (it reports what it has)", step.name, limit)
            _signal_group(proc, signal.SIGTERM)
            try:
                step.rc = proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                step.rc = proc.wait()
    step.seconds = round(time.monotonic() - t0, 1)
    if timed_out:
        step.status = "timeout"
        step.message = f"stopped at its {limit:.0f} s limit (rc {step.rc}); its partial output is kept"


def _fit_to_limit(arg: str, limit: float) -> str:
    """Placeholders in a step's argv that depend on the time it gets."""
    if arg == "{gpu_check_seconds}":  # torch import, CUDA start, warm-up and the last window take ~40 s
        return f"{max(10.0, min(60.0, limit - 45)):g}"
    if arg == "{gemm_max_seconds}":  # stop starting cases early enough to report before the limit
        return f"{max(30.0, limit - 25):g}"
    return arg


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def judge(step: Step, run: Run, gpu: bool, gpu_reason: str, log_path: Path) -> None:
    """Status and message from the step's exit status and output; a stub JSON where it left none."""
    output = run.out / step.output
    data = read_json(output) if step.output.endswith(".json") else None
    if step.status == "timeout":
        pass
    elif step.name == "report":
        produced = output.exists() and output.stat().st_size > 0
        ok = step.rc == 0 and produced
        step.status = ("no-gpu" if not gpu else "ok") if ok else "failed"
        step.message = (f"no GPU ({gpu_reason}): report of a run without a GPU" if not gpu else "report.md written") \
            if ok else f"rc {step.rc}: {_tail(log_path, 400)}"
    elif not gpu:
        expected = {"doctor": data is not None and step.rc in (0, 1),
                    "gpu_check": data is not None and data.get("gpu") is False and step.rc == 0,
                    "gemm_validation": data is not None and data.get("dry_run") is True and data.get("ok") is True
                    and step.rc == 0}[step.name]
        if expected:
            step.status = "no-gpu"
            step.message = f"no GPU ({gpu_reason}): ran in its no-GPU mode"
            if step.name == "doctor":
                step.message += f"; best source: {data.get('best_source')}"
        else:
            step.status = "failed"
            step.message = f"no GPU ({gpu_reason}), but the no-GPU mode misbehaved: rc {step.rc}, " + \
                ("output is not the expected JSON" if data is not None else "no JSON output")
    elif data is None:
        step.status = "failed"
        step.message = f"rc {step.rc}, no JSON output"
    elif step.name == "doctor":  # rc 1 = no usable source: a finding, not a failed step
        step.status = "ok" if step.rc in (0, 1) else "failed"
        step.message = f"best source: {data.get('best_source')}; rc {step.rc}"
    else:
        step.status = "ok" if step.rc == 0 else "failed"
        step.message = f"rc {step.rc}" + (f": {data['error']}" if data.get("error") else "") + \
            (f"; interrupted: {data['interrupted']}" if data.get("interrupted") else "")
    if step.output.endswith(".json") and data is None:
        raw = output.read_bytes() if output.exists() else b""
        if raw:
            with open(log_path, "ab") as stderr:
                stderr.write(f"\n----- {step.name}: stdout (not JSON)\n".encode() + raw[-20000:] + b"\n")
        stub = {"step": step.name, "status": step.status, "message": step.message, "stdout_tail": raw[-2000:].decode(
            errors="replace")}
        output.write_text(json.dumps(stub) + "\n")


def plan(python: str | None, wanted: set[str], profile: str, limits: dict[str, float]) -> list[Step]:
    """The steps with their arguments and limits; profile "smoke" = seconds-long versions (rehearsals)."""
    py = python or sys.executable
    if profile == "smoke":
        check_args = ["--size", "8192", "--seconds", "3", "--window", "0.5", "--clock-interval", "0.1",
                      "--point-interval", "0.05"]
        gemm_args = ["--dtypes", "bf16", "fp8", "--window", "0.3", "--windows", "2", "--warmup", "0.1"]
        check_limits, gemm_limits = (30, 5), (60, 5)
    else:
        check_args = ["--size", "8192", "--seconds", "{gpu_check_seconds}", "--window", "5"]
        gemm_args = ["--dtypes", "bf16", "fp16", "tf32", "fp8"]
        check_limits, gemm_limits = (150, 60), (270, 90)
    steps = [
        Step("doctor", [py, "-m", "otel_ofu", "doctor", "--json"], "doctor.json", 60, 10),
        Step("gpu_check", [py, "benchmarks/gpu_check.py", "--json", "--dtype", "bf16", *check_args], "gpu_check.json",
             *check_limits),
        Step("gemm_validation", [py, "benchmarks/gemm_validation.py", "--quick", "--json", *gemm_args,
                                 "--max-seconds", "{gemm_max_seconds}"], "gemm_validation.json", *gemm_limits),
        Step("report", [py, "benchmarks/device_report.py", "{out}"], "report.md", 30, 5),
    ]
    for step in steps:
        if step.name in limits:
            step.timeout_s = step.minimum_s = min(step.timeout_s, limits[step.name])
        if step.name not in wanted:
            step.asked, step.status, step.message = False, "skipped", "not asked for (DEVICE_STEPS)"
    return steps


def parse_limits(text: str) -> dict[str, float]:
    """DEVICE_STEP_LIMITS, "gemm_validation=200,gpu_check=100": a lower limit for some steps, seconds."""
    limits = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        try:
            limits[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or limits[name.strip()] <= 0:
            raise ValueError(f"bad step limit {item!r}: expected step=seconds, seconds > 0")
    return limits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or REPO / "device-out"),
                        help="output folder (default: $OUT, else ./device-out)")
    parser.add_argument("--budget", type=float, default=float(os.environ.get("DEVICE_BUDGET_S") or DEFAULT_BUDGET_S),
                        help=f"seconds for the whole run, install included (default $DEVICE_BUDGET_S or "
                             f"{DEFAULT_BUDGET_S:g})")
    parser.add_argument("--wheels", type=Path, default=Path(os.environ.get("DEVICE_WHEELS") or DEFAULT_WHEELS))
    parser.add_argument("--site", type=Path, default=Path(os.environ.get("DEVICE_SITE") or DEFAULT_SITE))
    parser.add_argument("--python", default=os.environ.get("OTEL_OFU_PYTHON") or None,
                        help="a Python that already has otel-ofu's dependencies (default $OTEL_OFU_PYTHON): no install")
    parser.add_argument("--steps", default=os.environ.get("DEVICE_STEPS") or "doctor,gpu_check,gemm_validation,report",
                        help="comma-separated steps to run (default: all; $DEVICE_STEPS)")
    parser.add_argument("--profile", choices=("full", "smoke"), default=os.environ.get("DEVICE_RUN_PROFILE") or "full",
                        help="full: the measurement; smoke: seconds-long steps, to rehearse the run "
                             "($DEVICE_RUN_PROFILE)")
    parser.add_argument("--step-limits", default=os.environ.get("DEVICE_STEP_LIMITS") or "",
                        help='lower some steps\' limits: "gemm_validation=200,gpu_check=100" ($DEVICE_STEP_LIMITS)')
    parser.add_argument("--manifest", type=Path, metavar="WHEELS_DIR",
                        help="write SOURCE.json into a wheels folder and exit (device_wheels.sh)")
    parser.add_argument("--manifest-python-version", default="3.12")
    args = parser.parse_args(argv)
    if args.manifest:
        write_manifest(args.manifest, args.manifest_python_version)
        return 0

    wanted = {s.strip() for s in args.steps.split(",") if s.strip()}
    try:
        limits = parse_limits(args.step_limits)
    except ValueError as exc:
        parser.error(str(exc))
    unknown = (wanted | set(limits)) - {"doctor", "gpu_check", "gemm_validation", "report"}
    if unknown:
        parser.error(f"unknown step(s) {', '.join(sorted(unknown))}")

    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "device_run.log"
    log_path.write_text("")
    log.setLevel(logging.INFO)
    formatter = logging.Formatter("%(asctime)s device_run: %(levelname)s %(message)s", "%H:%M:%S")
    for handler in (logging.StreamHandler(sys.stderr), logging.FileHandler(log_path)):
        handler.setFormatter(formatter)
        log.addHandler(handler)

    run = Run(out, args.budget)
    run.record.update({"command": os.environ.get("DEVICE_RUN_COMMAND") or "benchmarks/device_run.sh",
                       "started_utc": _utc_now(), "host": socket.gethostname(), "budget_s": args.budget,
                       "out": str(out), "driver_python": sys.version.split()[0]})

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    python = args.python
    setup_error = ""
    if python:
        run.record["environment"] = {"kind": "OTEL_OFU_PYTHON", "python": python}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    elif any(args.wheels.glob("*.whl")):
        log.info("installing the carried wheels from %s into %s", args.wheels, args.site)
        info = install_wheels(sys.executable, args.wheels, args.site, env, min(180.0, max(30.0, run.remaining() / 3)))
        run.record["environment"] = {"kind": "wheels", "python": sys.executable, **info}
        if "error" in info:
            setup_error = info["error"]
        else:
            python = sys.executable
            env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(args.site)])
    else:
        run.record["environment"] = {"kind": "none"}
        setup_error = (f"no otel-ofu environment: no wheels in {args.wheels} (run benchmarks/device_wheels.sh on a "
                       "machine with network and carry benchmarks/.wheels) and OTEL_OFU_PYTHON is not set")
    run.save()

    detected = run_quiet([python or sys.executable, "-c", DETECT], env, 120)
    if isinstance(detected, str) or detected.returncode != 0:
        why = detected if isinstance(detected, str) else detected.stderr[-500:]
        detection: dict[str, Any] = {"cuda": False, "reason": f"GPU detection failed: {why}"}
    else:
        detection = json.loads(detected.stdout.strip().splitlines()[-1])
    gpu = bool(detection.get("cuda"))
    gpu_reason = "" if gpu else str(detection.get("reason"))
    run.record.update({"gpu": gpu, "gpu_reason": gpu_reason, "gpu_name": detection.get("name"), "detect": detection})
    smi = shutil.which("nvidia-smi")
    if smi:
        result = run_quiet([smi, "--query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit",
                            "--format=csv,noheader"], env, 20)
        run.record["nvidia_smi"] = result if isinstance(result, str) else result.stdout.strip()
    log.info("GPU: %s", detection.get("name") if gpu else f"none ({gpu_reason})")
    run.record["profile"] = args.profile
    run.steps = plan(python, wanted, args.profile, limits)
    for step in run.steps:
        step.argv = [str(out) if a == "{out}" else a for a in step.argv]
    run.save()

    for step in run.steps:
        if not step.asked:
            continue
        if python is None:
            step.status = "no-gpu" if not gpu else "failed"
            step.message = (f"no GPU ({gpu_reason}): skipped, " if not gpu else "not run: ") + setup_error
            if step.output.endswith(".json"):
                (out / step.output).write_text(json.dumps({"step": step.name, "status": step.status,
                                                           "message": step.message}) + "\n")
            continue
        run_step(run, step, env, log_path)
        if step.status != "skipped":
            judge(step, run, gpu, gpu_reason, log_path)
        log.info("step %s: %s (%.0f s): %s", step.name, step.status, step.seconds, step.message)
        run.save()
    run.record["finished_utc"] = _utc_now()
    run.save()

    report = out / "report.md"
    if report.exists():
        sys.stdout.write(report.read_text())
    statuses = [s.status for s in run.steps if s.asked]
    log.info("done in %.0f s: %s", time.monotonic() - run.started,
             ", ".join(f"{s.name} {s.status}" for s in run.steps))
    if not gpu:
        return 0 if all(s == "no-gpu" for s in statuses) else 1
    if setup_error:
        return 2
    return 0 if all(s == "ok" for s in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
